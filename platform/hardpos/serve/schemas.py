"""The HTTP API's documented request/response schemas (OpenAPI at ``/docs``).

Bodies are NOT parsed through these models: :mod:`hardpos.serve.requests` parses them so
every listed mistake is a 400 naming its field rather than FastAPI's generic 422. These
models document the routes (``openapi_extra``) and shape the responses (``response_model``).
"""
# No `from __future__ import annotations`: FastAPI/pydantic read these annotations at runtime.

from typing import Any

from pydantic import BaseModel, Field



class ScoreRequest(BaseModel):
    image_b64: str = Field(description="the image bytes (PNG/JPEG/WEBP/GIF/BMP/TIFF) as base64, or a data: URL")
    captions: list[str] = Field(min_length=1, description="1..max_captions captions to score against the image")
    softmax: bool = Field(False, description="also return softmax(logit_scale * cosine) over the captions")


class ModelRef(BaseModel):
    name: str | None = None
    version: str | None = None
    source: str
    alias: str | None = None


class ScoreResponse(BaseModel):
    model: ModelRef
    scores: list[float] = Field(description="cosine similarity of the image with each caption, in order")
    probs: list[float] | None = Field(None, description="softmax over the captions (when requested)")
    logit_scale: float


class BatchItem(BaseModel):
    image_b64: str
    captions: list[str] = Field(min_length=1)


class BatchRequest(BaseModel):
    items: list[BatchItem] = Field(min_length=1)
    softmax: bool = False


class ItemError(BaseModel):
    status: int
    detail: str


class BatchResult(BaseModel):
    index: int
    scores: list[float] | None = None
    probs: list[float] | None = None
    error: ItemError | None = Field(None, description="this item was rejected (the others are still scored)")


class BatchResponse(BaseModel):
    model: ModelRef | None
    results: list[BatchResult]
    n_ok: int
    n_rejected: int


class CompareRequest(BaseModel):
    image_b64: str
    caption: str
    hard_negative: str
    hard_positive: str | None = None


class CompareResponse(BaseModel):
    model: ModelRef
    scores: dict[str, float] = Field(description="cosine of caption, hard_negative (and hard_positive)")
    correct_original: bool = Field(description="s_caption > s_hard_negative")
    correct_augmented: bool | None = Field(None, description="s_c > s_n and s_p > s_n (needs hard_positive)")
    brittle: bool | None = Field(None, description="(s_c > s_n > s_p) or (s_p > s_n > s_c) (needs hard_positive)")


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its ``$defs`` references inlined (openapi_extra has no
    components section of its own)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.split("/")[-1]])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """openapi_extra for a route whose JSON body is parsed by hand."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline_schema(model)}}}}


def json_or_multipart(model: type[BaseModel], file_field: str = "image") -> dict[str, Any]:
    """openapi_extra for a route that takes JSON or a multipart upload (file field ``image``)."""
    schema = inline_schema(model)
    form_props = {k: v for k, v in schema.get("properties", {}).items() if k != "image_b64"}
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": schema},
        "multipart/form-data": {"schema": {"type": "object", "required": [file_field],
                                           "properties": {file_field: {"type": "string", "format": "binary"}, **form_props}}},
    }}}

