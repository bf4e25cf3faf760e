"""Training, one module per job:

* :mod:`.config` -- ``TrainConfig`` and its sections (no torch, no Ray);
* :mod:`.loss` -- the combined loss (pure torch);
* :mod:`.lora` -- LoRA adapters placed as TSVLC places them, merged on save (pure torch);
* :mod:`.step` -- the model wrapper, optimiser, LR schedule and THE training step (pure torch);
* :mod:`.data` -- the Ray Data input pipeline;
* :mod:`.checkpoint` -- save / load / find-resume of training checkpoints;
* :mod:`.worker` -- the Ray Train worker loop around the step;
* :mod:`.trainer` -- the driver: step plan, paths, ``build_trainer``.

Import the submodules directly; this package imports nothing on its own.
"""
