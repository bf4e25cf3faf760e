"""HardPos: finetune CLIP with hard negatives and hard positives on Ray."""

__version__ = "0.1.0"
