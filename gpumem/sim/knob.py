"""The knob ``gpumem fit --vary`` turns: where a value enters the command.

    --vary batch_size=1..64       a NAME: the command's {batch_size} placeholders,
                                  its batch_size=V arguments (config overrides:
                                  batch_size=8, training.batch_size=8), and its
                                  --batch_size V / --batch_size=V flags (also
                                  spelt with '-' for '_': --batch-size)
    --vary=--batch-size=1..64     a FLAG, spelt out: only --batch-size V or
                                  --batch-size=V in the command
    --vary env:BATCH=1..64        an environment variable of the run
    --vary cfg.toml:training.batch_size=1..64
                                  a whole-number key of a config file (.toml,
                                  .yaml, .json: gpumem/sim/config_key.py) that
                                  the command names; each probe runs with a
                                  copy of the file, in the probe's folder

parse() reads the option (KnobError, one sentence, for anything malformed);
locate() says where the knob is in the command (KnobError when it is
nowhere, so that a probe never runs the command unchanged); apply() gives the
command and environment of one value.  Nothing here runs anything.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

from gpumem.sim import config_key

__all__ = ["Knob", "KnobError", "parse", "locate", "apply"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RANGE = re.compile(r"\s*(\d{1,12})\s*\.\.\s*(\d{1,12})\s*\Z")
_EXAMPLE = ("for example --vary batch_size=1..64, --vary=--batch-size=1..64, "
            "--vary env:BATCH_SIZE=1..64 or --vary train.toml:training.batch_size=1..64")


class KnobError(ValueError):
    """A --vary option or a command that does not say where the knob goes."""


@dataclass(frozen=True)
class Knob:
    kind: str     # "name", "flag", "env" or "file"
    name: str     # batch_size, --batch-size, BATCH_SIZE, training.batch_size
    lo: int
    hi: int
    file: Optional[str] = None   # the config file of a "file" knob, as given

    @property
    def label(self) -> str:
        """How the tables name the knob: batch_size, --batch-size, $BATCH_SIZE,
        training.batch_size."""
        return f"${self.name}" if self.kind == "env" else self.name


def parse(text: str) -> Knob:
    """'batch_size=1..64' -> Knob('name', 'batch_size', 1, 64)."""
    knob, sep, rng = str(text).rpartition("=")
    if not sep or not knob:
        raise KnobError(f"--vary {text[:60]!r}: expected KNOB=LO..HI, {_EXAMPLE}")
    m = _RANGE.match(rng)
    if not m:
        raise KnobError(f"--vary {text[:60]!r}: the range {rng[:30]!r} is not LO..HI with "
                        "whole numbers, for example 1..64")
    lo, hi = int(m.group(1)), int(m.group(2))
    if lo >= hi:
        raise KnobError(f"--vary {text[:60]!r}: the range must go up (LO < HI), not "
                        f"{lo}..{hi}")
    path, colon, key = knob.rpartition(":")
    if knob.startswith("env:"):
        kind, name = "env", knob[4:]
        ok = bool(_ENV.match(name))
    elif colon and path.lower().endswith(config_key.SUFFIXES):
        if not _NAME.match(key):
            raise KnobError(f"--vary {text[:60]!r}: {key[:40]!r} is not a config key, such as "
                            "training.batch_size")
        return Knob("file", key, lo, hi, path)
    elif knob.startswith("-"):
        kind, name = "flag", knob
        ok = bool(re.match(r"--?[A-Za-z0-9][A-Za-z0-9_.\-]*\Z", name))
    else:
        kind, name = "name", knob
        ok = bool(_NAME.match(name))
    if not ok:
        raise KnobError(f"--vary {text[:60]!r}: {knob[:40]!r} is not a knob: {_EXAMPLE}")
    return Knob(kind, name, lo, hi)


def _flag_spellings(knob: Knob) -> list[str]:
    if knob.kind == "flag":
        return [knob.name]
    names = {knob.name, knob.name.replace("_", "-"), knob.name.replace("-", "_")}
    return [f"--{n}" for n in sorted(names)]


def _sites(knob: Knob, cmd: list[str]) -> list[tuple[int, str, Optional[str]]]:
    """(argument index, how it is written, the flag when its value is the next
    argument) for every place the value goes."""
    out: list[tuple[int, str, Optional[str]]] = []
    flags = _flag_spellings(knob)
    for i, arg in enumerate(cmd):
        if knob.kind == "name" and "{" + knob.name + "}" in arg:
            out.append((i, "placeholder", None))
        elif knob.kind == "name" and arg.startswith(knob.name + "=") and i > 0:
            out.append((i, "key", None))
        elif any(arg.startswith(f + "=") for f in flags):
            out.append((i, "flag=", None))
        elif arg in flags:
            if i + 1 >= len(cmd) or cmd[i + 1].startswith("-") and not _is_number(cmd[i + 1]):
                raise KnobError(f"{arg} in the command has no value after it; write it with "
                                f"a value, for example {arg} 8, and fit will vary that value")
            out.append((i + 1, "flag", arg))
    return out


def _is_number(text: str) -> bool:
    return bool(re.fullmatch(r"-?\d+(\.\d*)?", text))


def _file_args(knob: Knob, cmd: list[str]) -> list[tuple[int, str]]:
    """(index, the text before the path) of each argument naming the config
    file: the path itself, or FLAG=path."""
    want = os.path.realpath(knob.file)
    out = []
    for i, arg in enumerate(cmd):
        for cut in [0] + [j + 1 for j, c in enumerate(arg) if c == "="]:
            if i > 0 and arg[cut:] and os.path.realpath(arg[cut:]) == want:
                out.append((i, arg[:cut]))
                break
    return out


def _read_file(knob: Knob) -> str:
    try:
        with open(knob.file, encoding="utf-8") as f:
            return f.read(1 << 24)
    except OSError as e:
        raise KnobError(f"--vary: cannot read the config file {knob.file} "
                        f"({e.strerror})") from None
    except UnicodeDecodeError:
        raise KnobError(f"--vary: the config file {knob.file} is not UTF-8 text") from None


def locate(knob: Knob, cmd: list[str]) -> str:
    """Where the knob is, in words ('--batch-size 8 in the command'); KnobError
    when the command does not hold it (an environment variable is always
    somewhere: the run's environment)."""
    if knob.kind == "env":
        return f"the environment variable {knob.name}"
    if knob.kind == "file":
        if not _file_args(knob, cmd):
            raise KnobError(f"--vary: the config file {knob.file} is not in the command; name "
                            "it there as the script reads it, for example --config "
                            f"{knob.file}")
        try:
            now = config_key.read(_read_file(knob), knob.file, knob.name)
        except config_key.ConfigKeyError as e:
            raise KnobError(f"--vary: {e}") from None
        return f"{knob.name} = {now} in {knob.file}"
    sites = _sites(knob, cmd)
    if not sites:
        if knob.kind == "flag":
            looked = f"{knob.name} V or {knob.name}=V"
        else:
            looked = (f"{{{knob.name}}}, {knob.name}=V, or "
                      + " / ".join(f"{f} V" for f in _flag_spellings(knob)))
        raise KnobError(f"--vary: the knob {knob.name!r} is not in the command (looked for "
                        f"{looked}); write it into the command with any value, for example "
                        f"python train.py --batch-size 8 with --vary batch-size=1..64, or use "
                        f"env:NAME for an environment variable")
    words = []
    for i, how, flag in sites:
        words.append(f"{flag} {cmd[i]}" if how == "flag" else cmd[i])
    return "the command's " + ", ".join(repr(w) for w in words)


def apply(knob: Knob, cmd: list[str], env: dict[str, str], value: int,
          folder: Optional[str] = None) -> tuple[list[str], dict[str, str]]:
    """The command and environment of one probe, with the knob set to value
    (a config file's copy is written into folder, which must exist)."""
    env = dict(env)
    cmd = list(cmd)
    if knob.kind == "env":
        env[knob.name] = str(value)
        return cmd, env
    if knob.kind == "file":
        if folder is None:
            raise ValueError("a config file knob needs a folder for the file's copy")
        copy = os.path.join(folder, os.path.basename(knob.file))
        with open(copy, "w", encoding="utf-8") as f:
            f.write(config_key.write(_read_file(knob), knob.file, knob.name, value))
        for i, before in _file_args(knob, cmd):
            cmd[i] = before + copy
        return cmd, env
    for i, how, _flag in _sites(knob, cmd):
        arg = cmd[i]
        if how == "placeholder":
            cmd[i] = arg.replace("{" + knob.name + "}", str(value))
        elif how in ("key", "flag="):
            cmd[i] = arg.split("=", 1)[0] + f"={value}"
        else:
            cmd[i] = str(value)
    return cmd, env
