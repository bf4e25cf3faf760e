"""The HTTP API's request contract and response shapes, as pydantic models.

The request models are both the validation and the documentation: :mod:`hardpos.serve.requests`
parses every request body with them, and the routes draw their OpenAPI request bodies
(``/docs``) from the same models, so the page and the checks cannot disagree. Response
models shape the answers (``response_model``).

Limits from the app config (``max_captions``, ``max_caption_chars``, ``max_batch_items``)
are read from the validation context: ``Model.model_validate(body, context={"limits":
ServingLimits})`` (the defaults without one). :func:`validation_message` turns pydantic's
errors into the 400 message, one phrase per mistake naming its field path
(``items[2].captions[0] is an empty caption``). What pydantic cannot check (base64, the image
bytes, token counts) is explicit code in :mod:`hardpos.serve.requests`.
"""
# No `from __future__ import annotations`: FastAPI/pydantic read these annotations at runtime.

import copy
import dataclasses
import functools
import re
import reprlib
from typing import Annotated, Any, Iterable, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo,
                      WrapValidator)
from pydantic_core import PydanticCustomError

from hardpos.serve.config import ServingLimits

_DEFAULT_LIMITS = ServingLimits()
MAX_MESSAGES = 10  # mistakes named in one 400; the rest are counted
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60


def _limits(info: ValidationInfo) -> ServingLimits:
    return (info.context or {}).get("limits") or _DEFAULT_LIMITS


# --------------------------------------------------------------------------- field types
# Messages of the custom errors are written with a {path} placeholder; validation_message
# puts the field path there.


def _check_caption(value: str, info: ValidationInfo) -> str:
    if not value.strip():
        raise PydanticCustomError("empty_caption", "{path} is an empty caption")
    limit = _limits(info).max_caption_chars
    if len(value) > limit:
        raise PydanticCustomError("caption_too_long", "{path} is too long: {n} characters; the limit is {limit}",
                                  {"n": len(value), "limit": limit})
    return value


def _count(limit_name: str, what: str) -> BeforeValidator:
    """A list of 1..``limits.<limit_name>`` entries, counted before its entries are validated
    (the messages carry the configured limit; the field's ``min_length=1`` shows on the page)."""

    def check(value: Any, info: ValidationInfo) -> Any:
        limit = getattr(_limits(info), limit_name)
        if isinstance(value, list) and not value:
            raise PydanticCustomError("empty", "{path} is empty: give 1..{limit} {what}", {"what": what, "limit": limit})
        if isinstance(value, list) and len(value) > limit:
            raise PydanticCustomError("too_many", "too many {what}: {n} in {path}; the limit is {limit}",
                                      {"what": what, "n": len(value), "limit": limit})
        return value

    return BeforeValidator(check)


def _form_flag(value: Any) -> bool:
    """A form field's flag: the text ``true`` or ``false`` (an empty field: the default, false)."""
    if value in ("true", "false", ""):
        return value == "true"
    raise PydanticCustomError("form_flag", "{path} must be true or false, got {got}", {"got": _repr.repr(value)})


# Where a limit of the app config belongs in the JSON schema: ``openapi_document`` replaces
# the marker with ``maxItems`` / ``maxLength`` of the configured value, so the page states
# the limits the running app enforces.
LIMIT_MARKER = "x-hardpos-limit"


def _limit(name: str) -> dict[str, str]:
    return {LIMIT_MARKER: name}


# A caption: a string with a non-blank character, at most limits.max_caption_chars characters.
# (Captions longer than the model's context length in tokens are refused by the model
# replica: a limit of the loaded model that JSON Schema cannot state; the description says so.)
Caption = Annotated[str, AfterValidator(_check_caption), Field(json_schema_extra={
    "minLength": 1, "pattern": r"\S", **_limit("max_caption_chars")})]
Captions = Annotated[list[Caption], Field(min_length=1, json_schema_extra=_limit("max_captions")),
                     _count("max_captions", "captions")]
# A JSON body's flag: true or false, nothing else (null, 0/1 and "true" are 400s, as the schema says).
Flag = Annotated[bool, Field(strict=True)]
# A multipart form's flag: form fields are text, so the text true or false (an empty field: false).
FormFlag = Annotated[bool, BeforeValidator(_form_flag)]
ImageB64 = Annotated[str, Field(
    description="the image bytes (PNG/JPEG/WEBP/GIF/BMP/TIFF) as base64, or a data: URL",
    json_schema_extra={"format": "byte", "contentEncoding": "base64", "contentMediaType": "image/*", "minLength": 1})]


# --------------------------------------------------------------------------- requests


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown (e.g. misspelled) field is a 400


class _Image(_Body):
    image_b64: ImageB64


_CAPTIONS_DOC = "1..max_captions captions to score against the image"
_SOFTMAX_DOC = "also return softmax(logit_scale * cosine) over the captions"


class ScoreForm(_Body):
    """/v1/score's fields besides the image: a multipart upload sends these as form fields."""

    captions: Captions = Field(description=_CAPTIONS_DOC)
    softmax: FormFlag = Field(False, description=_SOFTMAX_DOC)


class ScoreRequest(_Image):  # fields: image_b64, captions, softmax
    """Score one image against 1..max_captions captions."""

    captions: Captions = Field(description=_CAPTIONS_DOC)
    softmax: Flag = Field(False, description=_SOFTMAX_DOC)


class CompareForm(_Body):
    """/v1/compare's fields besides the image: a multipart upload sends these as form fields."""

    caption: Caption = Field(description="the caption that describes the image")
    hard_negative: Caption = Field(description="a minimal edit of the caption that no longer describes the image")
    hard_positive: Caption | None = Field(
        None, description="optional: a rewording that keeps the meaning (adds correct_augmented and brittle)")


class CompareRequest(CompareForm, _Image):  # fields: image_b64, caption, hard_negative, hard_positive
    """Scores of a caption, its hard negative and (optionally) its hard positive for one image."""


class BatchItem(_Image):
    captions: Captions = Field(description="1..max_captions captions to score against this image")


@dataclasses.dataclass
class RejectedItem:
    """A batch item that failed validation: its pydantic errors (locations relative to the item)."""

    errors: list[dict[str, Any]]


def _any_item(schema: dict[str, Any]) -> None:
    """An item's schema: a BatchItem, or anything else, which is rejected alone (the request
    still answers 200, with that item's 400 in its result), as the validation does."""
    item = dict(schema)
    schema.clear()
    schema["anyOf"] = [item, {"description": "anything else: this item alone is rejected (its result has a 400)"}]


def _item_or_rejected(value: Any, handler: Any) -> Any:
    try:
        return handler(value)
    except ValidationError as exc:
        return RejectedItem(exc.errors())


class BatchRequest(_Body):
    """Many (image, captions) items; each is scored or rejected on its own."""

    # An item that fails validation stays in its slot as a RejectedItem (a per-item 400):
    # one bad item neither fails nor silently drops the others.
    items: Annotated[list[Annotated[BatchItem, WrapValidator(_item_or_rejected), Field(json_schema_extra=_any_item)]],
                     Field(min_length=1, json_schema_extra=_limit("max_batch_items")),
                     _count("max_batch_items", "items")] = Field(
        description="1..max_batch_items {image_b64, captions} objects")
    softmax: Flag = Field(False, description="also return softmax(logit_scale * cosine) over each item's captions")


# --------------------------------------------------------------------------- responses


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


class ErrorResponse(BaseModel):
    """The body of every refusal (4xx, 503)."""

    detail: str = Field(description="what was wrong; names the field for bad input")


class HealthResponse(BaseModel):
    status: Literal["ok", "unavailable"]
    model: str | None = Field(None, description="the model source (when ok)")
    version: str | None = Field(None, description="the registry version loaded (when ok)")
    detail: str | None = Field(None, description="why no model is loaded (when unavailable)")


class CompareResponse(BaseModel):
    model: ModelRef
    scores: dict[str, float] = Field(description="cosine of caption, hard_negative (and hard_positive)")
    correct_original: bool = Field(description="s_caption > s_hard_negative")
    correct_augmented: bool | None = Field(None, description="s_c > s_n and s_p > s_n (needs hard_positive)")
    brittle: bool | None = Field(None, description="(s_c > s_n > s_p) or (s_p > s_n > s_c) (needs hard_positive)")


# --------------------------------------------------------------------------- error messages


def field_path(loc: Iterable[Any], root: str = "request") -> str:
    """``("items", 2, "captions", 0)`` -> ``items[2].captions[0]``; ``()`` -> ``root``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or root


def _schema_at(schema: dict[str, Any], loc: Iterable[Any]) -> dict[str, Any]:
    """The (inlined) JSON schema node that describes the value at ``loc`` ({} if none)."""
    node = schema
    for part in loc:
        node = _non_null(node)
        node = node.get("items", {}) if isinstance(part, int) else node.get("properties", {}).get(part, {})
    return _non_null(node)


def _non_null(node: dict[str, Any]) -> dict[str, Any]:
    for branch in node.get("anyOf", ()):  # Optional[X]: describe X
        if branch.get("type") != "null":
            return branch
    return node


def _phrase(err: dict[str, Any], schema: dict[str, Any], root: str, prefix: tuple[Any, ...],
            limits: ServingLimits | None) -> str:
    kind, loc, value = err["type"], tuple(err["loc"]), err.get("input")
    path, node = field_path(prefix + loc, root), _schema_at(schema, loc)
    got = "null" if value is None else type(value).__name__
    if "{path}" in err["msg"]:  # ours (the field types above)
        return err["msg"].replace("{path}", path)
    if kind in ("bool_type", "bool_parsing"):  # before "missing": a flag's null is a wrong value
        return f"{path} must be a boolean (true or false), got {'null' if value is None else _repr.repr(value)}"
    if kind == "missing" or (loc and value is None and kind.endswith("_type")):  # a field's null counts as absent
        hint = node.get("description") if loc and isinstance(loc[-1], str) else None  # a field's, not a model's
        if hint and limits is not None:  # "1..max_captions captions" -> "1..64 captions"
            hint = re.sub(r"\bmax_\w+", lambda m: str(getattr(limits, m[0], m[0])), hint)
        return f"{path} is missing" + (f": expected {hint}" if hint else "")
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"{path} must be a JSON object, got {got}"
    if kind == "list_type":
        item = _schema_at(schema, loc + (0,)).get("type")
        return f"{path} must be a list{f' of {item}s' if item else ''}, got {got}"
    if kind == "string_type":
        return f"{path} must be a {'base64 ' if node.get('contentEncoding') == 'base64' else ''}string, got {got}"
    return f"{path}: {err['msg']}"


@functools.cache
def _inline_schema_cached(model: type[BaseModel]) -> dict[str, Any]:
    return inline_schema(model)


def validation_message(errors: list[dict[str, Any]], model: type[BaseModel] | None = None, root: str = "request",
                       prefix: tuple[Any, ...] = (), limits: ServingLimits | None = None) -> str:
    """One 400 message for pydantic ``errors`` (``ValidationError.errors()``) of ``model``:
    each mistake as a phrase naming its field path (``prefix`` + its location; ``root`` for
    the body itself), unknown fields of one object together with the allowed ones, a missing
    field with its description (``limits`` fill in the configured limits), joined by `` | ``."""
    schema = _inline_schema_cached(model) if model is not None else {}
    unknown: dict[tuple[Any, ...], list[str]] = {}
    phrases: list[str] = []
    for err in errors:
        if err["type"] == "extra_forbidden":
            unknown.setdefault(tuple(err["loc"][:-1]), []).append(_repr.repr(err["loc"][-1]))
        else:
            phrases.append(_phrase(err, schema, root, prefix, limits))
    for where, names in reversed(unknown.items()):
        allowed = ", ".join(sorted(_schema_at(schema, where).get("properties", {})))
        phrases.insert(0, f"{field_path(prefix + where, root)}: unknown field(s) {', '.join(names[:MAX_MESSAGES])}"
                          + (f" (and {len(names) - MAX_MESSAGES} more)" if len(names) > MAX_MESSAGES else "")
                          + (f"; allowed: {allowed}" if allowed else ""))
    phrases = list(dict.fromkeys(phrases))  # one phrase per distinct mistake
    if not phrases:
        return f"{root} is invalid"
    more = len(phrases) - MAX_MESSAGES
    return " | ".join(phrases[:MAX_MESSAGES]) + (f" | and {more} more" if more > 0 else "")


# --------------------------------------------------------------------------- OpenAPI


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


def list_fields(model: type[BaseModel]) -> set[str]:
    """The model's list-valued fields (a multipart form may repeat them)."""
    return {name for name, prop in _inline_schema_cached(model).get("properties", {}).items()
            if _non_null(prop).get("type") == "array"}


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """openapi_extra for a route whose JSON body is ``model``."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline_schema(model)}}}}


def json_or_multipart(model: type[BaseModel], form: type[BaseModel], file_field: str = "image") -> dict[str, Any]:
    """openapi_extra for a route that takes ``model`` as JSON, or a multipart upload: the
    image as the file field ``image`` and ``form``'s fields as form fields."""
    form_schema = inline_schema(form)
    required = form_schema.get("required", [])
    lists = list_fields(form)
    properties = {name: _or_one(prop) if name in lists else prop if name in required else _or_empty(prop)
                  for name, prop in form_schema.get("properties", {}).items()}
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": inline_schema(model)},
        "multipart/form-data": {"schema": {
            "type": "object", "required": [file_field, *required], "additionalProperties": False,
            "properties": {file_field: {"type": "string", "format": "binary"}, **properties}}},
    }}}


def _or_one(prop: dict[str, Any]) -> dict[str, Any]:
    """A list form field's schema: the list (repeated fields), or one field holding one entry."""
    listed = {k: v for k, v in prop.items() if k not in ("title", "description")}
    return {"anyOf": [listed, prop["items"]], **{k: prop[k] for k in ("title", "description") if k in prop}}


def _or_empty(prop: dict[str, Any]) -> dict[str, Any]:
    """An optional form field's schema: its own, or an empty field (which counts as not sent)."""
    empty = {"type": "string", "maxLength": 0, "description": "an empty field: not sent"}
    branches = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]  # a form has no null
    rest = {k: v for k, v in prop.items() if k not in ("anyOf", "type") and k not in branches[0]}
    return {**rest, "anyOf": [*branches, empty]}


# --------------------------------------------------------------------------- the OpenAPI document

ERRORS = {
    400: "bad input: the message names each mistake's field path",
    401: "bearer auth is on and the Authorization header is missing, malformed or wrong",
    404: "the configured model does not exist (unknown registered model, alias, version, path or tag)",
    413: "the body, an image's bytes or its pixel count is over the configured limit",
    415: "a multipart upload reached a server that cannot parse multipart",
    503: "no model is loaded, the model is at capacity, or it did not answer within limits.request_timeout_s",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=`` for the refusals ``codes``: each with :class:`ErrorResponse` as its body."""
    return {code: {"model": ErrorResponse, "description": ERRORS[code]} for code in codes}


def _fill_limits(node: Any, limits: ServingLimits) -> None:
    if isinstance(node, dict):
        name = node.pop(LIMIT_MARKER, None)
        if name is not None:
            node["maxItems" if node.get("type") == "array" else "maxLength"] = getattr(limits, name)
        for value in node.values():
            _fill_limits(value, limits)
    elif isinstance(node, list):
        for value in node:
            _fill_limits(value, limits)


def openapi_document(base: dict[str, Any], limits: ServingLimits, auth: bool) -> dict[str, Any]:
    """The running app's OpenAPI document: ``base`` (FastAPI's, from the route declarations)
    with the configured ``limits`` in place of the limit markers (``maxItems`` / ``maxLength``),
    and, when bearer ``auth`` is on, the bearer security scheme on every operation that can
    answer 401 (without auth, those 401 responses are dropped: they cannot happen). Pure;
    ``base`` is not modified."""
    doc = copy.deepcopy(base)
    _fill_limits(doc, limits)
    for ops in doc.get("paths", {}).values():
        for op in ops.values():
            responses = op.get("responses", {})
            if "401" not in responses:
                continue
            if auth:
                op["security"] = [{"bearer": []}]
            else:
                del responses["401"]
    if auth:
        doc.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
            "type": "http", "scheme": "bearer", "description": "the token in the server's $HARDPOS_SERVE_TOKEN"}
    return doc


# What this process's /openapi.json states. Serve pickles the ingress class by value (its
# globals are copies), while functions of this importable module travel by reference: the
# replica's ScoringAPI sets the state here and the route reads it here, the same dict.
_CONTRACT: dict[str, Any] = {"limits": ServingLimits(), "auth": False}


def set_contract(limits: ServingLimits, auth: bool) -> None:
    """Record the running app's limits and auth (one ScoringAPI per replica process)."""
    _CONTRACT.update(limits=limits, auth=auth)


def contract_document(base: dict[str, Any]) -> dict[str, Any]:
    """:func:`openapi_document` of ``base`` with what :func:`set_contract` recorded (the
    defaults, auth off, when nothing did: the bare FastAPI app)."""
    return openapi_document(base, _CONTRACT["limits"], _CONTRACT["auth"])
