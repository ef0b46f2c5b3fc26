"""Finding hardware profiles: a bare name or alias in the profile folders, or a path to a file.

Folders searched, first match wins: each folder of `$TILEKIT_HWPROFILES` (separated by
`os.pathsep`), then the repository's `hwprofiles/` (found relative to the package). A name
matches a file's stem, its `name:` or one of its `aliases:`, ignoring case; a stem match
wins over an alias in the same folder. An argument that
contains a path separator or ends in `.yaml`/`.yml` is a path, never a name. Names and
aliases are read, and folders listed, only from files that look like profiles
(`looks_like_profile`: a folder may also hold tile IR documents); a file's stem always names
it. An IR records the profile with its content hash, and `load_recorded_profile` refuses a
profile of other figures found under the recorded name.

A profile file is read only when it is a regular file of at most `limits.PROFILE_BYTES`
(checked before reading; `/dev/zero`, a FIFO or a huge file is refused), whether it was
named on the command line, found in a folder or recorded in an IR document's `hardware`.
An IR may record a path (tk-roll does, for a profile given by a path that no name finds):
relative to the IR's folder and ending in `.yaml`/`.yml` (`tilekit.ir.names`), it resolves
under the same rules. Errors quote a file's content only as a short escaped excerpt.

Loaded profiles are cached by (path, modification time, size): `Profile` is immutable, so
tools and tests that ask for "h100" a thousand times parse the file once.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tilekit import limits
from tilekit.errors import ProfileError, TilekitError, excerpt
from tilekit.fileio import check_path, read_stream, regular_file
from tilekit.hw.profile import Profile
from tilekit.hw.schema import parse_yaml, read_profile
from tilekit.ir.names import PROFILE_SUFFIXES, is_profile_path
from tilekit.resources import shipped

ENV_VAR = "TILEKIT_HWPROFILES"
SUFFIXES = PROFILE_SUFFIXES


def builtin_dir() -> Path:
    """The `hwprofiles/` folder that ships with tilekit (tilekit.resources)."""
    return shipped("hwprofiles")


def profile_dirs() -> list[Path]:
    """The folders searched for names, in order: $TILEKIT_HWPROFILES, then the shipped one."""
    dirs = []
    for entry in os.environ.get(ENV_VAR, "").split(os.pathsep):
        if not entry:
            continue
        folder = Path(entry)
        try:
            check_path(entry, ENV_VAR)
            is_dir = folder.is_dir()
        except (TilekitError, OSError):
            is_dir = False
        if not is_dir:
            raise ProfileError(f"folder '{entry}' does not exist", ENV_VAR,
                               "fix or unset the variable")
        dirs.append(folder)
    if builtin_dir().is_dir():
        dirs.append(builtin_dir())
    return dirs


def is_path(name_or_path: str) -> bool:
    return is_profile_path(name_or_path) or os.sep in name_or_path


def display_path(path: Path) -> str:
    """A short name for messages: relative to the working directory when inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)
    return str(path) if rel.startswith("..") else rel


def _yaml_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in SUFFIXES and p.is_file())


def _files(folder: Path) -> list[Path]:
    """The profile files of a search folder: `.yaml`/`.yml` files that look like profiles
    (`looks_like_profile`), so that a folder also holding tile IR documents or other YAML
    (`TILEKIT_HWPROFILES=$PWD`) can be searched and listed."""
    return [p for p in _yaml_files(folder) if looks_like_profile(p)]


#: How much of a file `looks_like_profile` reads: a profile's top-level keys come early.
_SNIFF_BYTES = 64 * 1024
#: Top-level keys only a hardware profile has (tilekit.hw.schema); an IR has `tilekit:`.
_PROFILE_KEY = re.compile(r"^(schema|arch|parallelism|memory|compute)[ \t]*:", re.M)
_IR_KEY = re.compile(r"^tilekit[ \t]*:", re.M)


def looks_like_profile(path: Path) -> bool:
    """Whether a YAML file in a search folder is a hardware profile, from its first 64 KiB:
    a top-level key only profiles have and no `tilekit:` key (a tile IR document). A broken
    profile still has them, so listing or loading it reports what is wrong; a file named by
    its stem (`--hw big` for big.yaml) is loaded whatever it looks like."""
    try:
        st = path.stat()
    except OSError:
        return False
    return _sniff(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=1024)
def _sniff(path: str, mtime_ns: int, size: int) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(_SNIFF_BYTES).decode("utf-8", "replace")
    except OSError:
        return False
    return bool(_PROFILE_KEY.search(head)) and not _IR_KEY.search(head)


@functools.lru_cache(maxsize=256)
def _names_cached(path: str, mtime_ns: int, size: int) -> frozenset[str]:
    names = {Path(path).stem.lower()}
    try:
        data = parse_yaml(_read_text(path, path), path)
    except (TilekitError, OSError):
        return frozenset(names)  # a broken file still answers to its stem; loading reports it
    if isinstance(data, dict):
        if isinstance(data.get("name"), str):
            names.add(data["name"].lower())
        aliases = data.get("aliases")
        if isinstance(aliases, list):
            names.update(a.lower() for a in aliases if isinstance(a, str))
    return frozenset(names)


def _names(path: Path) -> frozenset[str]:
    st = path.stat()
    if st.st_size > limits.PROFILE_BYTES.value:
        return frozenset({path.stem.lower()})  # loading it reports the size
    return _names_cached(str(path), st.st_mtime_ns, st.st_size)


def resolve(name: str) -> Path:
    """The file a bare profile name or alias stands for; errors list the known names."""
    wanted = name.lower()
    for folder in profile_dirs():
        # a file named exactly is meant, profile-like or not (loading it says what is wrong)
        by_stem = [p for p in _yaml_files(folder) if p.stem.lower() == wanted]
        if len(by_stem) == 1:  # the common case, without reading every file's aliases
            return by_stem[0]
        matches = [p for p in _files(folder) if wanted in _names(p)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            listed = ", ".join(display_path(p) for p in matches)
            raise ProfileError("ambiguous hardware profile name", excerpt(name, quote=False),
                               f"it names {listed}; pass a path instead")
    known = profile_names()
    close = difflib.get_close_matches(wanted, [n.lower() for n in known], n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    hint += f"known: {', '.join(known) or 'none'}; or pass a path to a YAML file"
    raise ProfileError("unknown hardware profile", excerpt(name, quote=False), hint)


def _read_text(path: str, origin: str) -> str:
    """A profile file's text, at most `limits.PROFILE_BYTES` (the file may grow after its
    size was checked)."""
    try:
        with open(path, "rb") as fh:
            raw = read_stream(fh, limits.PROFILE_BYTES, origin)
    except OSError as exc:
        raise ProfileError(f"cannot read: {exc.strerror}", origin) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"not UTF-8 text (byte {exc.start})", origin) from None


@functools.lru_cache(maxsize=64)
def _load_cached(path: str, origin: str, mtime_ns: int, size: int) -> Profile:
    return read_profile_text(_read_text(path, origin), origin)


def read_profile_text(text: str, origin: str) -> Profile:
    """Validate profile YAML given as text; `origin` names it in messages ("<stdin>")."""
    if not text.strip():
        raise ProfileError("empty input, expected a hardware profile", origin,
                           "see docs/hwprofiles.md for the format")
    return read_profile(parse_yaml(text, origin), origin)


def read_profile_file(path: str | Path, where: str | None = None) -> Profile:
    """Load and validate the profile at `path`, a regular file of at most
    `limits.PROFILE_BYTES`. Errors are located as `path:line: field` (`where` names the
    flag or field that gave the path, for errors about the file itself)."""
    origin = str(path)
    try:
        st = regular_file(path, where,
                          limits.PROFILE_BYTES)
    except limits.LimitError:
        raise
    except TilekitError as exc:
        raise ProfileError(exc.what, exc.where, exc.hint) from None
    return _load_cached(os.path.realpath(origin), origin, st.st_mtime_ns, st.st_size)


def load_profile(name_or_path: str | Path) -> Profile:
    """A `Profile` from a bare name or alias (`h100`, `H100-SXM`) or a path to a YAML file."""
    if isinstance(name_or_path, Path) or is_path(name_or_path):
        return read_profile_file(name_or_path)
    if not name_or_path:
        raise ProfileError("empty hardware profile name", "--hw",
                           f"known: {', '.join(profile_names())}")
    path = resolve(name_or_path)
    return read_profile_file(display_path(path))


def _ir_folder(ir_path: str | None) -> Path:
    """The folder a profile path recorded in an IR document is relative to: the IR file's,
    or the working directory for stdin/stdout."""
    if not ir_path or ir_path in ("-", "<stdin>", "<output>"):
        return Path.cwd()
    return Path(ir_path).resolve().parent


def _found_by_name(name: str, path: Path) -> bool:
    try:
        return resolve(name).resolve() == path.resolve()
    except ProfileError:
        return False


def recorded_profile(given: str, profile: Profile, ir_output: str | None) -> str:
    """What an IR document written to `ir_output` records as its `hardware` for the profile
    the user gave as `given` (a name or a path), so that later stages load the same file:
    the profile's name when that name finds it (shipped profiles, `$TILEKIT_HWPROFILES`),
    else its path relative to the output IR's folder (the working directory for stdout)."""
    path = Path(given) if is_path(given) else resolve(given)
    if _found_by_name(profile.name, path):
        return profile.name
    try:
        rel = os.path.relpath(path.resolve(), _ir_folder(ir_output))
    except ValueError:  # another drive on Windows
        return path.resolve().as_posix()
    rel = Path(rel).as_posix()
    return rel if is_path(rel) else f"./{rel}"


def load_recorded_profile(hardware: str, ir_path: str | None,
                          sha256: str | None = None) -> Profile:
    """The profile an IR document's `hardware` names: a name, or a relative path to a
    `.yaml`/`.yml` file from the IR file's folder (the working directory when the IR came
    through stdin); see `recorded_profile` and the module docstring.

    With `sha256` (the IR's `hardware.sha256`), the profile found must have that content
    hash: a profile of other figures under the same name (a copy that kept `name: h100`
    in `$TILEKIT_HWPROFILES`, an edited file) is refused, naming both files and the fix."""
    from tilekit.ir.names import hardware_problem

    problem = hardware_problem(hardware)
    if problem is not None:
        raise ProfileError(problem, "hardware", "a profile name (tk-hw list), or a relative "
                           "path to a profile's .yaml file; or pass --hw")
    if not is_path(hardware):
        profile = load_profile(hardware)
    else:
        path = _ir_folder(ir_path) / hardware
        if not path.exists():
            raise ProfileError(f"hardware profile file '{hardware}' not found (looked in "
                               f"{display_path(path.parent)})", "hardware",
                               "paths in the IR are relative to the IR file's folder, or to "
                               "the current directory when the IR comes through stdin; or "
                               "pass --hw")
        profile = read_profile_file(display_path(path), "hardware")
    if sha256 is not None and profile.content_hash != sha256:
        raise _other_figures(hardware, profile, sha256, ir_path)
    return profile


def _other_figures(hardware: str, profile: Profile, sha256: str,
                   ir_path: str | None) -> ProfileError:
    """The error for a recorded profile whose figures changed: the IR, the file loaded now,
    and the file it was made with when a search folder still holds it."""
    ir = "the IR" if not ir_path or ir_path in ("-", "<stdin>") else display_path(Path(ir_path))
    made_with = [p for p in _all_files() if _content_hash(p) == sha256]
    loaded = display_path(Path(profile.origin)) if profile.origin else hardware
    what = (f"{ir} was made with a '{hardware}' profile of other figures (sha256 "
            f"{sha256[:12]}) than {loaded} (sha256 {profile.content_hash[:12]})")
    if made_with:
        hint = (f"it was made with {display_path(made_with[0])}: pass --hw "
                f"{display_path(made_with[0])}; or re-run tk-roll --hw {hardware} to tile for "
                f"{loaded}")
    else:
        hint = (f"pass --hw with the profile file it was made with, or re-run tk-roll --hw "
                f"{hardware} to tile for {loaded}")
    return ProfileError(what, "hardware", hint)


def _content_hash(path: Path) -> str | None:
    try:
        return read_profile_file(path).content_hash
    except TilekitError:
        return None


def _all_files() -> list[Path]:
    """Every profile file of the search folders, in search order (shadowed ones too)."""
    return [p for folder in profile_dirs() for p in _files(folder)]


def profile_names() -> list[str]:
    """Names (file stems) of every profile in the search folders, sorted; no file is validated."""
    seen: dict[str, None] = {}
    for folder in profile_dirs():
        for p in _files(folder):
            seen.setdefault(p.stem, None)
    return sorted(seen)


def list_profiles() -> tuple[Profile, ...]:
    """Every profile in the search folders, validated, sorted by name.

    A stem found in several folders is listed once, from the first folder (that is how a
    `$TILEKIT_HWPROFILES` folder overrides a shipped profile). A broken file is an error.
    """
    chosen: dict[str, Path] = {}
    for folder in profile_dirs():
        for p in _files(folder):
            chosen.setdefault(p.stem, p)
    profiles = [read_profile_file(display_path(p)) for p in chosen.values()]
    return tuple(sorted(profiles, key=lambda prof: prof.name))


def host_cpu_profile(cores: int) -> Profile | None:
    """The shipped CPU profile of this machine's SIMD ISA (`tilekit.hw.cpu.host_isa`: the
    vectors `g++ -march=native` builds the CPU kernels with), the first by name (AVX-512:
    icelake, AVX2: milan, SVE: graviton3), scaled to `cores`; None when no shipped profile
    has that ISA. What compiled CPU code is cut for when no profile is given (tk-run): tiles
    for another ISA's registers waste the vectors the code is built with."""
    from tilekit.hw.cpu import host_isa

    isa = host_isa()
    if isa is None:
        return None
    for path in _yaml_files(builtin_dir()):
        profile = read_profile_file(display_path(path))
        if profile.is_cpu and profile.cpu.isa == isa:
            return profile.with_cpu(cores=max(1, cores))
    return None


@dataclass(frozen=True)
class Listed:
    """One profile file as `tk-hw list` shows it: the profile, its file, whether it ships
    with tilekit, and (when another file answers to its name first) the file `--hw NAME`
    loads instead."""

    profile: Profile
    path: Path
    shipped: bool
    shadowed_by: Path | None = None

    def file(self) -> str:
        """The file for people: `<shipped>/h100.yaml` for a shipped one (the same on every
        machine), else relative to the working directory when inside it."""
        return f"<shipped>/{self.path.name}" if self.shipped else display_path(self.path)


def listing() -> tuple[Listed, ...]:
    """Every profile file of the search folders (validated; a broken one is an error), shadowed
    ones too, sorted by name then search order: a file whose name resolves to another file
    (a copy in `$TILEKIT_HWPROFILES` that kept `name: h100`) is marked with that file."""
    shipped = builtin_dir().resolve() if builtin_dir().is_dir() else None
    entries = []
    for order, path in enumerate(_all_files()):
        profile = read_profile_file(display_path(path))
        try:
            found = resolve(profile.name)
        except ProfileError:
            found = path
        shadow = None if found.resolve() == path.resolve() else found
        entries.append((profile.name.lower(), order,
                        Listed(profile, path, path.resolve().parent == shipped, shadow)))
    return tuple(e for _, _, e in sorted(entries, key=lambda e: (e[0], e[1])))
