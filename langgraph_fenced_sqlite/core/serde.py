"""Data-only serialization: objects <-> (type tag, bytes), no SQL.

Invariant: decoding constructs only classes the application itself gave or
itself stored in this process, and imports nothing a row names unless the
allow-list names it. A reader rebuilds a `(module, name)` found in its
`TypeRegistry` from that class object, with no import at all; the registry
holds the classes given as `allowed_types`, those of a bound graph's schemas
(`for_graph`), and the classes of every value this serializer (or one
derived from it, which shares the registry) proved and stored. Only a
`(module, name)` outside the registry that LangGraph's `SAFE_MSGPACK_TYPES`,
an allowed `(module, name)` pair or an allowed module prefix names is
imported. Pickle, the legacy `json` tag and unknown tags are refused on both
sides, whatever `LANGGRAPH_STRICT_MSGPACK` says.

A write is accepted only once its value is proven to rebuild: the bytes are
decoded here, with the reader's own code and the classes found in the value,
into a value that encodes to the same bytes (or compares equal); then those
classes are registered. So a class defined inside a function or nested in
another rebuilds in this process, and in a fresh one for a reader given the
class (`allowed_types`, `for_graph`); a value whose constructor changes it
(a validator rewriting a field...) is refused when written, naming its type.

A reader meeting a stored value whose type it does not allow refuses it
(`SerializationError`, which the saver reports as `UndecodableRow`): restored
state that silently differs from what was written is worse than an error, and
the error names the type and the fix. Only a display reader (`unknown="tag"`,
the CLI's) returns such a value as a `TaggedValue` (type name and fields),
built from plain data: no import, no constructor.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ormsgpack
from langgraph.checkpoint.serde import _msgpack as lg_msgpack
from langgraph.checkpoint.serde import jsonplus
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from ..errors import SerializationError, bad_argument
from . import messages
from .compression import ZSTD_MSGPACK, inflate
from .encryption import AES_SUFFIX, NO_KEY, CellRefused, Encryption
from .rebuild import PACK_OPTION, construct, encodes_to, equal, short
from .user_types import (
    TaggedValue,
    TypeRegistry,
    instance_classes,
    schema_classes,
    schema_types,
    write_context,
)

__all__ = [
    "READ_OPTION",
    "DataOnlySerializer",
    "TaggedValue",
    "TypeKey",
    "TypeRegistry",
    "forget_read_errors",
    "schema_classes",
    "schema_types",
    "write_context",
]

TypeKey = tuple[str, ...]

_OPTION = ormsgpack.OPT_NON_STR_KEYS
# The option `DataOnlySerializer.plain_msgpack_hook`'s callers read with.
READ_OPTION = _OPTION
_unpackb = ormsgpack.unpackb

# The tags we write and read; everything else (pickle, json, ...) is refused.
_TAGS = frozenset({"null", "bytes", "bytearray", "msgpack", ZSTD_MSGPACK})
_CONSTRUCTORS = {
    jsonplus.EXT_CONSTRUCTOR_SINGLE_ARG,
    jsonplus.EXT_CONSTRUCTOR_POS_ARGS,
    jsonplus.EXT_CONSTRUCTOR_KW_ARGS,
    jsonplus.EXT_PYDANTIC_V1,
    jsonplus.EXT_PYDANTIC_V2,
}
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")
_SAFE = lg_msgpack.SAFE_MSGPACK_TYPES
_FIX = (
    "allow it, e.g. FencedSqliteSaver(path, allowed_types=[{name}]) or "
    "allowed_modules=[{package!r}], or bind the graph that declares it: "
    "builder.compile(checkpointer=saver.for_graph(builder))"
)


def _normalize(
    types: Iterable[TypeKey | type], argument: str = "allowed_types"
) -> tuple[frozenset[TypeKey], list[type]]:
    if isinstance(types, (str, type)) or not isinstance(types, Iterable):
        raise bad_argument(
            argument, f"expected a list of classes or (module, name) tuples, got {types!r}"
        )
    out: set[TypeKey] = set()
    classes: list[type] = []
    for item in types:
        if isinstance(item, type):
            out.add((item.__module__, item.__name__))
            classes.append(item)  # rebuilt from the object: no import, local classes too
        elif (
            isinstance(item, tuple)
            and len(item) >= 2
            and all(isinstance(part, str) and part for part in item)
        ):
            out.add(tuple(item))
        else:
            raise bad_argument(
                argument,
                f"each entry must be a class or a (module, name) tuple, got {item!r}",
            )
    return frozenset(out), classes


def _normalize_modules(modules: Iterable[str] | str) -> tuple[str, ...]:
    if isinstance(modules, str):
        modules = (modules,)  # allowed_modules="myapp" means the one package
    if not isinstance(modules, Iterable):
        raise bad_argument("allowed_modules", f"expected a list of module names, got {modules!r}")
    out: set[str] = set()
    for module in modules:
        if not (isinstance(module, str) and _MODULE.match(module)):
            raise bad_argument(
                "allowed_modules", f"each entry must be a dotted module name, got {module!r}"
            )
        out.add(module)
    return tuple(sorted(out))


class DataOnlySerializer(JsonPlusSerializer):
    """LangGraph's msgpack serializer, restricted to an allow-list of types.

    It writes exactly what `JsonPlusSerializer` writes (so rows stay readable
    by LangGraph tooling) but never pickles, stores a value only once it has
    rebuilt it (then remembers its classes), and its reader rebuilds only
    remembered or allowed types; anything else raises `SerializationError`.
    """

    def __init__(
        self,
        allowed_types: Iterable[TypeKey | type] = (),
        *,
        allowed_modules: Iterable[str] | str = (),
        unknown: str = "refuse",
    ) -> None:
        """Allow LangGraph's safe types plus `allowed_types` and `allowed_modules`.

        Args:
            allowed_types: Extra classes, or `(module, name)` tuples, that
                stored values may contain. A class given as the object is
                rebuilt from it, with no import (local classes included).
            allowed_modules: Module names whose classes (theirs and their
                submodules') stored values may contain, e.g. `["myapp"]`.
                Reading a row that names `myapp.x.Y` imports `myapp.x`.
            unknown: What the reader does with a stored value whose type it
                does not allow or cannot rebuild: `"refuse"` (raise
                `SerializationError`) or `"tag"` (return a `TaggedValue`;
                for displaying a file, never for resuming from it).

        Raises:
            InvalidArgument: a malformed entry or `unknown` value.
        """
        extra, classes = _normalize(allowed_types)
        modules = _normalize_modules(allowed_modules)
        if unknown not in ("refuse", "tag"):
            raise bad_argument("unknown", f'expected "refuse" or "tag", got {unknown!r}')
        super().__init__(pickle_fallback=False, allowed_msgpack_modules=tuple(extra) or None)
        self._extra = extra
        self._modules = modules
        self._unknown = unknown
        self._allowed = _SAFE | extra
        self._registry = TypeRegistry()
        self._registry.add(classes)
        # The hooks of plain reads, by `tag` mode (see `_unpack`).
        self._plain_hooks: dict[bool, tuple[DataOnlySerializer, Callable[[int, bytes], Any]]] = {}
        self._encryption: Encryption | None = None

    @property
    def encryption(self) -> Encryption | None:
        """The keyring stored values are sealed with (None: stored in clear)."""
        return self._encryption

    @property
    def reads_plaintext(self) -> bool:
        """Whether a value stored in clear is read (no encryption, or `accept_plaintext`)."""
        return self._encryption is None or self._encryption.accept_plaintext

    def with_encryption(self, encryption: Encryption | None) -> DataOnlySerializer:
        """Return this serializer sealing and opening stored values with `encryption`.

        It shares this one's registry; `encryption` None returns one that stores in clear.
        """
        if encryption is self._encryption:
            return self
        clone = self._derive(self._extra, self._unknown)
        clone._encryption = encryption
        return clone

    @property
    def allowed_types(self) -> frozenset[TypeKey]:
        """The `(module, name)` pairs this serializer may rebuild (prefixes aside)."""
        return self._allowed

    @property
    def allowed_modules(self) -> tuple[str, ...]:
        """The module prefixes whose classes this serializer may rebuild."""
        return self._modules

    @property
    def registry(self) -> TypeRegistry:
        """The classes rebuilt without import, shared with every derived serializer."""
        return self._registry

    @property
    def unknown(self) -> str:
        """What the reader does with a value it may not rebuild: `"refuse"` or `"tag"`."""
        return self._unknown

    def refusing(self) -> DataOnlySerializer:
        """Return this serializer with `unknown="refuse"` (for a reader that writes back)."""
        if self._unknown == "refuse":
            return self
        return self._derive(self._extra, "refuse")

    def _derive(self, extra: frozenset[TypeKey], unknown: str) -> DataOnlySerializer:
        # Shared, not copied: LangGraph's strict mode hands the graph a copy of
        # the saver with a derived serializer, and a value written through one
        # must read back through the other.
        clone = DataOnlySerializer(extra, allowed_modules=self._modules, unknown=unknown)
        clone._registry = self._registry
        clone._encryption = getattr(self, "_encryption", None)
        return clone

    def allows(self, module: str, name: str) -> bool:
        """Tell whether a stored `module.name` value may be rebuilt."""
        return self._allows(module, name, {})

    def _allows(self, module: str, name: str, overlay: Mapping[TypeKey, type]) -> bool:
        key = (module, name)
        if key in self._allowed or key in overlay or key in self._registry:
            return True
        return any(module == m or module.startswith(m + ".") for m in self._modules)

    def _class(self, key: TypeKey, overlay: Mapping[TypeKey, type]) -> type | None:
        if key in _SAFE:
            return None  # LangGraph's own types: imported by name, never learned
        return overlay.get(key) or self._registry.get(key)

    def with_msgpack_allowlist(
        self, extra_allowlist: Iterable[TypeKey | type]
    ) -> DataOnlySerializer:
        """Return a serializer that also allows `extra_allowlist` (sharing this one's registry).

        Classes given as objects are registered in the shared registry.
        """
        extra, classes = _normalize(extra_allowlist, "extra_allowlist")
        self._registry.add(classes)
        if extra <= self._allowed:
            return self
        return self._derive(self._extra | extra, self._unknown)

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        """Encode `obj` once it is proven to read back equal.

        The classes of `obj`'s user values are then registered, so this
        serializer and those derived from it rebuild them without import.

        Raises:
            SerializationError: `obj` holds a type with no data encoding, or
                one that does not rebuild into an equal value; for a dict
                (a checkpoint's channel values) the message names the key.
        """
        try:
            return self._dumps(obj)
        except SerializationError as exc:
            path = self._locate(obj)
            if not path:
                raise
            raise write_context(exc, channel=path[0], keys=path[1:]) from None

    def _locate(self, obj: Any, depth: int = 0) -> list[str]:
        # Which key of a channel-values dict (and of a dict inside it, such as
        # the graph's input under `__start__`) holds the refused value.
        if not isinstance(obj, dict) or depth > 3:
            return []
        for key, value in obj.items():
            try:
                self._dumps(value)
            except SerializationError:
                return [str(key), *self._locate(value, depth + 1)]
        return []

    def _dumps(self, obj: Any) -> tuple[str, bytes]:
        tag, data, used_ext = self.pack(obj)
        if used_ext:
            self.prove(obj, data)
        return tag, data

    def pack(self, obj: Any) -> tuple[str, bytes, bool]:
        """Encode `obj` as `dumps_typed` would, without proving it; also say whether it must be.

        Returns:
            `(tag, bytes, needs_proof)`: `needs_proof` is False when the
            encoding names no class (plain data rebuilds as itself); else the
            bytes may be stored only once `prove(obj, bytes)` returned.

        Raises:
            SerializationError: `obj` holds a type with no data encoding.
        """
        if obj is None:
            return "null", b"", False
        if isinstance(obj, bytes):
            return "bytes", obj, False
        if isinstance(obj, bytearray):
            return "bytearray", bytes(obj), False
        data, used_ext = self._pack(obj, obj)
        return "msgpack", data, used_ext

    def _pack(self, obj: Any, whole: Any) -> tuple[bytes, bool]:
        used_ext = False
        refused: list[SerializationError] = []

        def default(value: Any) -> Any:
            nonlocal used_ext
            used_ext = True
            try:
                # A LangChain message whose attributes are what `model_dump`
                # would give: packed as they are (`messages.encoded`).
                fast = messages.encoded(value)
                return jsonplus._msgpack_default(value) if fast is None else fast
            except TypeError as exc:
                # ormsgpack replaces what `default` raises with its own error.
                name = _qualname(value)
                refused.append(
                    SerializationError(
                        name,
                        message=(
                            f"type {name} has no data encoding; store plain data, or a "
                            "dataclass / pydantic model / enum / NamedTuple the saver allows"
                        ),
                    )
                )
                raise refused[-1] from exc

        try:
            data = ormsgpack.packb(obj, default=default, option=PACK_OPTION)
        except (ormsgpack.MsgpackEncodeError, TypeError, ValueError) as exc:
            if refused:
                raise refused[0] from None
            raise SerializationError(_qualname(whole), message=f"cannot encode: {exc}") from exc
        return data, used_ext

    def prove(self, obj: Any, data: bytes) -> None:
        """Prove that `data` (`pack(obj)`'s bytes) reads back equal to `obj`; learn its classes.

        Raises:
            SerializationError: a class the encoding names is not allowed, or
                the value does not rebuild into an equal one.
        """
        # Walk first with a hook that checks but builds nothing: LangGraph's
        # own safe types need no proof, and building them on every put costs.
        user_types: list[TypeKey] = []
        self._unpack(data, build=False, seen=user_types, tag=False)
        if not user_types:
            return
        # The classes the encoding names, as objects from the value itself:
        # the application stored them, so they may be rebuilt (a row alone
        # never gets here). A name not found in the value must be allowed.
        found = instance_classes(obj)
        overlay = {key: found[key] for key in user_types if key in found}
        for module, name in user_types:
            if not self._allows(module, name, overlay):
                raise _not_allowed(f"{module}.{name}", module)
        # The reader's own decode, here and now: dataclass fields the
        # constructor does not take, a validator that rewrites a field...
        # fail now, not on resume.
        rebuilt = self._unpack(data, build=True, tag=False, overlay=overlay)
        if encodes_to(rebuilt, data) or equal(rebuilt, obj):
            self._registry.add(overlay.values())
            return
        names = sorted({f"{m}.{n}" for m, n in user_types})
        raise SerializationError(
            names[0],
            message=(
                f"a value of type {names[0]} does not read back equal (decoding "
                f"{names} gives {short(rebuilt)}); store plain data, "
                "or make its constructor accept "
                "what its fields hold"
            ),
        )

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        """Decode a `(tag, bytes)` pair written by `dumps_typed`.

        Raises:
            SerializationError: the tag is not ours (pickle, json, unknown),
                the payload is corrupt, or (unless `unknown="tag"`) it names a
                type outside the allow-list or one that does not rebuild.
        """
        tag, payload = data
        if self._encryption is not None:
            # Sealed cells are opened; one in clear only with `accept_plaintext`.
            try:
                tag, payload = self._encryption.open_typed(tag, payload)
            except (CellRefused, TypeError, AttributeError) as exc:
                raise SerializationError(str(tag), message=str(exc)) from exc
        if tag == ZSTD_MSGPACK:
            # A stored value compressed (compression.compress_typed); its
            # checksum covered the compressed bytes.
            try:
                payload = inflate(payload)
            except (ValueError, TypeError) as exc:
                raise SerializationError(tag, message=f"{tag}: {exc}") from exc
            tag = "msgpack"
        if tag == "msgpack":
            # The common case (every value of every read), first and with no
            # keyword call: `_unpack`'s plain read, inlined.
            unknown_tag = self._unknown == "tag"
            cached = self._plain_hooks.get(unknown_tag)
            if cached is None or cached[0] is not self:
                return self._unpack(payload, build=True, tag=unknown_tag)
            # The hook's error list is empty between calls (every failure
            # below empties it), so it is looked up only when one failed.
            try:
                return _unpackb(payload, ext_hook=cached[1], option=_OPTION)
            except (ValueError, TypeError) as exc:
                errors = _hook_errors()
                if errors:
                    first = errors[0]
                    errors.clear()
                    raise first from None
                raise SerializationError("msgpack", message=f"corrupt msgpack: {exc}") from exc
            except BaseException:
                _hook_errors().clear()
                raise
        if tag == "null":
            return None
        if tag == "bytes":
            return bytes(payload)
        if tag == "bytearray":
            return bytearray(payload)
        if isinstance(tag, str) and tag.endswith(AES_SUFFIX):
            raise SerializationError(tag, message=NO_KEY)
        raise SerializationError(
            str(tag), message=f"serializer tag {tag!r} is refused (only {sorted(_TAGS)})"
        )

    def loads_opened(self, payload: bytes) -> Any:
        """Decode msgpack this process rebuilt from cells it opened (`values.RESOLVED`).

        A stored cell goes through `loads_typed`, which refuses one in clear
        when encryption is on; this does not look at the policy.

        Raises:
            SerializationError: as `loads_typed`.
        """
        return self._unpack(payload, build=True, tag=self._unknown == "tag")

    def plain_msgpack_hook(self) -> Callable[[int, bytes], Any]:
        """Return the ext hook `loads_typed` reads plain msgpack with.

        For a reader that decodes a page of values (`list`) with no method
        frame per value (a third of a small value's cost): where
        `ormsgpack.unpackb(payload, ext_hook=hook, option=READ_OPTION)`
        returns, its value is `loads_typed(("msgpack", payload))`'s; where
        it raises, call `forget_read_errors()`, then `loads_typed`, whose
        error it is to raise.
        """
        return self._plain_hook(self._unknown == "tag")

    def _plain_hook(self, tag: bool) -> Callable[[int, bytes], Any]:
        # One hook made once per serializer and mode (`_unpack`).
        cached = self._plain_hooks.get(tag)
        # Checked by owner: a shallow copy of this serializer shares the
        # dict, and must not read through a hook bound to this one.
        if cached is None or cached[0] is not self:
            cached = (
                self,
                self._make_hook(build=True, tag=tag, errors=None, seen=None, overlay={}),
            )
            self._plain_hooks[tag] = cached
        return cached[1]

    def _unpack(
        self,
        payload: bytes,
        *,
        build: bool,
        tag: bool,
        seen: list[TypeKey] | None = None,
        overlay: Mapping[TypeKey, type] | None = None,
    ) -> Any:
        # ormsgpack turns any exception raised by an ext hook into a bare
        # `ValueError("ext_hook failed")` with no cause, so the hook records
        # its error here and we re-raise that one.
        if build and seen is None and not overlay:
            # A plain read (every row of every get_tuple and list): one hook
            # made once per serializer and mode, its errors kept per thread,
            # instead of three closures made per value.
            errors = _hook_errors()
            errors.clear()
            hook = self._plain_hook(tag)
        else:
            errors = []
            hook = self._make_hook(
                build=build, tag=tag, errors=errors, seen=seen, overlay=overlay or {}
            )
        try:
            return ormsgpack.unpackb(payload, ext_hook=hook, option=_OPTION)
        except (ValueError, TypeError) as exc:
            if errors:
                first = errors[0]
                errors.clear()
                raise first from None
            raise SerializationError("msgpack", message=f"corrupt msgpack: {exc}") from exc
        except BaseException:
            errors.clear()  # `loads_typed` relies on finding the list empty
            raise

    def _make_hook(
        self,
        *,
        build: bool,
        tag: bool,
        errors: list[SerializationError] | None,
        seen: list[TypeKey] | None,
        overlay: Mapping[TypeKey, type],
    ) -> Callable[[int, bytes], Any]:
        # `seen` is the write-time walk: it lists the user types the encoding
        # names and refuses none of them (`prove` decides, with the value's
        # own classes in hand). `errors` None: the calling thread's list
        # (`_hook_errors`), for a hook shared by every plain read.
        def hook(code: int, data: bytes) -> Any:
            try:
                return check_or_build(code, data)
            except SerializationError as exc:
                (_hook_errors() if errors is None else errors).append(exc)
                raise

        def refuse(name: str, payload: Any, exc: SerializationError) -> Any:
            # A display reader shows what it may not build as data; the
            # payload was decoded by this very hook, so it is data already.
            if tag:
                return TaggedValue(name, payload, str(exc))
            raise exc

        def check_or_build(code: int, data: bytes) -> Any:
            if code == jsonplus.EXT_DELTA_SNAPSHOT:
                inner = ormsgpack.unpackb(data, ext_hook=hook, option=_OPTION)
                return _DeltaSnapshot(inner) if build else None
            if code == jsonplus.EXT_NUMPY_ARRAY:
                dtype, shape, order, buf = ormsgpack.unpackb(data, option=_OPTION)
                if seen is not None:
                    seen.append(("numpy", "ndarray"))
                elif not self._allows("numpy", "ndarray", overlay):
                    exc = _not_allowed("numpy.ndarray", "numpy")
                    return refuse("numpy.ndarray", {"dtype": dtype, "shape": shape}, exc)
                if not build:
                    return None
                import numpy as np  # allowed, or already imported by the app that stored it

                return np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape, order=order)
            if code not in _CONSTRUCTORS and code != jsonplus.EXT_METHOD_SINGLE_ARG:
                raise SerializationError(f"ext:{code}", message=f"unknown msgpack ext {code}")
            tup = ormsgpack.unpackb(data, ext_hook=hook, option=_OPTION)
            if not (isinstance(tup, (list, tuple)) and len(tup) >= 3):
                raise SerializationError(f"ext:{code}", message="malformed msgpack ext")
            module, name = tup[0], tup[1]
            if not (isinstance(module, str) and isinstance(name, str)):
                raise SerializationError(f"ext:{code}", message="malformed msgpack ext")
            dotted = f"{module}.{name}"
            if code == jsonplus.EXT_METHOD_SINGLE_ARG:
                method = tup[3] if len(tup) > 3 else None
                if (module, name, method) not in lg_msgpack.SAFE_MSGPACK_METHODS:
                    return refuse(dotted, tup[2], SerializationError(f"{dotted}.{method}"))
            elif seen is not None:
                if (module, name) not in _SAFE:
                    seen.append((module, name))
            elif not self._allows(module, name, overlay):
                return refuse(dotted, tup[2], _not_allowed(dotted, module))
            if not build:
                return None
            try:
                return construct(code, tup, self._class((module, name), overlay))
            except SerializationError as exc:
                return refuse(dotted, tup[2], exc)

        return hook


# The errors a shared read hook met, per thread (ormsgpack drops them: see `_unpack`).
_HOOK_ERRORS = threading.local()


def forget_read_errors() -> None:
    """Empty this thread's record of a plain read's hook errors (see `plain_msgpack_hook`)."""
    _hook_errors().clear()


def _hook_errors() -> list[SerializationError]:
    try:
        errors: list[SerializationError] = _HOOK_ERRORS.errors
    except AttributeError:
        errors = _HOOK_ERRORS.errors = []
    return errors


def _not_allowed(dotted: str, module: str) -> SerializationError:
    return SerializationError(
        dotted,
        message=f"type {dotted} is not allowed; "
        + _FIX.format(name=dotted, package=module.partition(".")[0]),
    )


def _qualname(value: Any) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"
