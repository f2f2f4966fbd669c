"""Allocator settings strings: gpumem._conf."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpumem._conf import (KEYS, MAX_SPLIT_MB, TORCH_ONLY_KEYS, ConfError, default_conf,
                          format_conf, parse_conf, parse_uint, settings_for_snapshot)
from gpumem.snapshots.unpickle import load_snapshot

MiB = 1 << 20
SNAPSHOTS = Path(__file__).parent.parent.parent / "shared" / "snapshots"
REAL = sorted(SNAPSHOTS.glob("*.pickle")) if SNAPSHOTS.is_dir() else []
ACCEPTED = ("expandable_segments, max_split_size_mb, garbage_collection_threshold, "
            "roundup_power2_divisions")


def test_defaults():
    conf = parse_conf("")
    assert conf == {
        "expandable_segments": False,
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
        "roundup_power2_divisions": [0] * 16,
    }
    assert parse_conf(None) == conf == default_conf()
    assert parse_conf("  ") == conf
    assert set(conf) == {"expandable_segments", "max_split_size",
                         "garbage_collection_threshold", "roundup_power2_divisions"}


@pytest.mark.parametrize("text, value", [("expandable_segments:True", True),
                                         ("expandable_segments:False", False),
                                         (" expandable_segments : True ", True)])
def test_expandable_segments(text, value):
    assert parse_conf(text)["expandable_segments"] is value


@pytest.mark.parametrize("bad", ["true", "1", "yes", "TRUE", "Truee"])
def test_expandable_segments_bad(bad):
    with pytest.raises(ConfError) as ei:
        parse_conf(f"expandable_segments:{bad}")
    msg = str(ei.value)
    assert "'expandable_segments'" in msg and f"'{bad}'" in msg and "True and False" in msg


@pytest.mark.parametrize("mb", [20, 21, 64, 128, 4096])
def test_max_split_size(mb):
    assert parse_conf(f"max_split_size_mb:{mb}")["max_split_size"] == mb * MiB


def test_max_split_size_is_clamped_to_what_the_allocator_stores():
    """Issue 16.9: 2**43 MiB and more gave OverflowError at install(); torch
    clamps such values (to SIZE_MAX / 1 MiB), gpumem clamps them to the
    largest whose bytes fit in 63 bits; 2**64 and more torch refuses."""
    from gpumem import _C
    largest = parse_conf(f"max_split_size_mb:{MAX_SPLIT_MB}")
    assert largest["max_split_size"] == MAX_SPLIT_MB * MiB < 1 << 63
    a = _C.Allocator(capacity=64 * MiB, settings=largest)
    assert a.settings()["max_split_size"] == MAX_SPLIT_MB * MiB
    assert parse_conf(format_conf(largest)) == largest
    for text in (str(MAX_SPLIT_MB + 1), "8796093022208", str((1 << 64) - 1)):
        assert parse_conf(f"max_split_size_mb:{text}") == largest
    for text in (str(1 << 64), "99999999999999999999", "9" * 5000):
        with pytest.raises(ConfError, match="at least 20"):
            parse_conf(f"max_split_size_mb:{text}")
    with pytest.raises(ConfError, match="below 2\\*\\*43"):
        format_conf(dict(default_conf(), max_split_size=(MAX_SPLIT_MB + 1) * MiB))


def test_roundup_divisions_above_what_the_allocator_stores_are_refused():
    """Issue 16.9 and 34: 2**40 divisions were silently stored as 0, then
    clamped to 2**31.  gpumem stores 32 bits: counts up to 2**31 are taken
    as they are and larger ones refused in one line naming the range (torch
    takes any power of two; above 2**54 its own rounding overflows)."""
    from gpumem import _C
    top = [1 << 31] * 16
    assert parse_conf(f"roundup_power2_divisions:{1 << 31}")["roundup_power2_divisions"] == top
    assert parse_conf(f"roundup_power2_divisions:[32768:{1 << 31}]")[
        "roundup_power2_divisions"] == top
    for text in (str(1 << 32), str(1 << 40), str(1 << 63), f"[32768:{1 << 40}]",
                 str(1 << 64), f"[256:{1 << 64}]", str(3 << 40)):
        with pytest.raises(ConfError, match="power of two from 1 to 2\\*\\*31") as ei:
            parse_conf(f"roundup_power2_divisions:{text}")
        assert "'roundup_power2_divisions'" in str(ei.value) and "\n" not in str(ei.value)
    with pytest.raises(ConfError, match="up to 2\\*\\*31"):
        format_conf(dict(default_conf(), roundup_power2_divisions=[1 << 40] * 16))
    for size in (MiB + 1, 3 * MiB + 513, 40 * MiB + 7):
        assert _C.round_size(size, {"roundup_power2_divisions": top}) == -(-size // 512) * 512
    # the extension refuses what would not fit instead of truncating it
    for divs in ([1 << 40] * 16, [-1] * 16, [1 << 32] * 16):
        with pytest.raises(ValueError, match="up to 2\\*\\*31"):
            _C.Allocator(capacity=64 * MiB, settings={"roundup_power2_divisions": divs})
    with pytest.raises(ValueError, match="below 2\\*\\*63"):
        _C.Allocator(capacity=64 * MiB, settings={"max_split_size": 1 << 63})


@pytest.mark.parametrize("text", ["²", "٣٠", "64²", "６４", "2¹", "+64", " 6 4x"])
def test_numbers_are_ascii_digits(text):
    """Issue 16.10: str.isdigit() accepts '²', which int() then refuses."""
    for key in ("max_split_size_mb", "roundup_power2_divisions"):
        with pytest.raises(ConfError):
            parse_conf(f"{key}:{text}")
    assert parse_uint(text, 1 << 64) is None


def test_parse_uint():
    assert parse_uint("0", 5) == 0 and parse_uint("005", 5) == 5 and parse_uint("6", 5) is None
    assert parse_uint("9" * 5000, 1 << 64) is None and parse_uint("", 5) is None
    assert parse_uint("0" * 5000 + "7", 10) == 7


@pytest.mark.parametrize("bad", ["19", "0", "-64", "64.5", "abc", "1e3"])
def test_max_split_size_bad(bad):
    # torch's rule: max_split_size_mb must be >= 20
    with pytest.raises(ConfError) as ei:
        parse_conf(f"max_split_size_mb:{bad}")
    msg = str(ei.value)
    assert "'max_split_size_mb'" in msg and "at least 20" in msg


@pytest.mark.parametrize("value", [0.5, 0.01, 0.999])
def test_garbage_collection_threshold(value):
    conf = parse_conf(f"garbage_collection_threshold:{value}")
    assert conf["garbage_collection_threshold"] == value


@pytest.mark.parametrize("bad", ["0", "1", "1.0", "0.0", "-0.5", "2", "nan", "inf", "half"])
def test_garbage_collection_threshold_bad(bad):
    with pytest.raises(ConfError) as ei:
        parse_conf(f"garbage_collection_threshold:{bad}")
    msg = str(ei.value)
    assert "'garbage_collection_threshold'" in msg and "less than 1" in msg


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_roundup_single_value_applies_to_every_interval(n):
    assert parse_conf(f"roundup_power2_divisions:{n}")["roundup_power2_divisions"] == [n] * 16


def test_roundup_list_torch_example():
    # 256 MiB is interval 8: the first entry also fills intervals 0..7, and
    # '>' fills everything after the previous entry (1024 MiB, interval 10).
    conf = parse_conf("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    assert conf["roundup_power2_divisions"] == [1] * 9 + [2, 4] + [8] * 5


def test_roundup_list_unnamed_intervals_stay_off():
    conf = parse_conf("roundup_power2_divisions:[64:8, 256:4]")
    assert conf["roundup_power2_divisions"] == [8] * 7 + [0, 4] + [0] * 7


def test_roundup_list_edges():
    divs = parse_conf("roundup_power2_divisions:[1:2,32768:4]")["roundup_power2_divisions"]
    assert divs == [2] + [0] * 14 + [4]
    # Boundaries past the last interval land in it, as in torch.
    divs = parse_conf("roundup_power2_divisions:[65536:16]")["roundup_power2_divisions"]
    assert divs == [16] * 16
    # A leading '>' starts after interval 0, as in torch.
    divs = parse_conf("roundup_power2_divisions:[>:2]")["roundup_power2_divisions"]
    assert divs == [0] + [2] * 15
    # Zero turns rounding off for one interval.
    divs = parse_conf("roundup_power2_divisions:[4:4,8:0,>:4]")["roundup_power2_divisions"]
    assert divs == [4, 4, 4, 0] + [4] * 12


@pytest.mark.parametrize("text, fragment", [
    ("roundup_power2_divisions:3", "'3'"),
    ("roundup_power2_divisions:0", "'0'"),
    ("roundup_power2_divisions:[256:3]", "'256:3'"),
    ("roundup_power2_divisions:[300:2]", "'300:2'"),
    ("roundup_power2_divisions:[0:2]", "'0:2'"),
    ("roundup_power2_divisions:[256:1", "']'"),
    ("roundup_power2_divisions:[256:1 512:2]", "'256:1512'"),  # spaces vanish, as in torch
    ("roundup_power2_divisions:[256]", "':'"),
    ("roundup_power2_divisions:", "no value"),
])
def test_roundup_bad(text, fragment):
    with pytest.raises(ConfError) as ei:
        parse_conf(text)
    msg = str(ei.value)
    assert "'roundup_power2_divisions'" in msg and fragment in msg


@pytest.mark.parametrize("key", ["foo", "max_split_size", "Expandable_segments"])
def test_unknown_key(key):
    with pytest.raises(ConfError) as ei:
        parse_conf(f"expandable_segments:True,{key}:1")
    assert str(ei.value).startswith(f"unknown allocator setting '{key}' (torch: \"Unrecognized "
                                    f"key '{key}'\"); gpumem implements {ACCEPTED}, and leaves "
                                    f"torch's other keys")


def test_torchs_other_keys_are_checked_and_left_to_torch():
    """Issue 34: torch's keys that gpumem does not implement pass the check
    when their value is of the kind torch reads, and change nothing in
    gpumem's dict; a value torch's parser would answer with IndexError or
    a bare 'stoull' is refused in one line naming the key."""
    ok = ("per_process_memory_fraction:0.5,backend:native,release_lock_on_cudamalloc:True,"
          "pinned_num_register_threads:8,max_non_split_rounding_mb:0,"
          "per_process_memory_fraction:1,per_process_memory_fraction:0")
    assert parse_conf(ok) == default_conf()
    assert set(TORCH_ONLY_KEYS) & set(KEYS) == set()
    for text, key in (("per_process_memory_fraction:1e-400", "per_process_memory_fraction"),
                      ("per_process_memory_fraction:1.5", "per_process_memory_fraction"),
                      ("pinned_num_register_threads:" + "9" * 30, "pinned_num_register_threads"),
                      ("max_non_split_rounding_mb:-1", "max_non_split_rounding_mb"),
                      ("release_lock_on_cudamalloc:1", "release_lock_on_cudamalloc"),
                      ("backend:[native]", "backend"), ("backend:cudaMalloc", "backend"),
                      ("large_segment_size_mb", "large_segment_size_mb")):
        with pytest.raises(ConfError) as ei:
            parse_conf(text)
        msg = str(ei.value)
        assert f"'{key}'" in msg and "\n" not in msg, msg


#: Issue 34's settings that torch 2.14.1's parser answers badly or accepts by
#: accident, and what gpumem's one check says instead (a fragment of its line).
ISSUE_34_REFUSED = [
    ("max_split_size_mb:-5", "max_split_size_mb", "at least 20 and below 2**64"),
    ("max_split_size_mb:" + "9" * 40, "max_split_size_mb", "at least 20 and below 2**64"),
    ("garbage_collection_threshold:1e-400", "garbage_collection_threshold",
     "greater than 0 and less than 1"),
    ("garbage_collection_threshold:1e-310", "garbage_collection_threshold",
     "greater than 0 and less than 1"),
    ("max_split_size_mb:²²²", "max_split_size_mb", "in ASCII digits"),
    ("roundup_power2_divisions:[1:2,", "roundup_power2_divisions", "closing ']'"),
    ("roundup_power2_divisions:1099511627776", "roundup_power2_divisions", "2**31"),
    ("max_split_size_mb:25abc", "max_split_size_mb", "at least 20"),
    ("max_split_size_mb:20:", "max_split_size_mb", "separate entries with ','"),
    ("max_split_size_mb", "max_split_size_mb", "expects ':'"),
    ("roundup_power2_divisions:[1:2:3]", "roundup_power2_divisions", "expects ',' or ']'"),
]


@pytest.mark.parametrize("text,key,fragment", ISSUE_34_REFUSED)
def test_issue_34_settings_are_refused_in_one_line(text, key, fragment):
    """Every entry point without torch (gpumem simulate's and gpumem
    doctor's check of the variables, gpumem replay --conf) refuses the
    same string with the same line; the torch side is in
    tests/test_torch_install.py."""
    from gpumem.pytorch.installer import AllocConfError, check_environment
    with pytest.raises(ConfError) as ei:
        parse_conf(text)
    line = str(ei.value)
    assert f"'{key}'" in line and fragment in line and "\n" not in line, line
    assert "stoull" not in line and "stod" not in line and "INTERNAL" not in line
    for var in ("GPUMEM_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        with pytest.raises(AllocConfError) as ei:
            check_environment({var: text})
        assert str(ei.value).endswith(line) and str(ei.value).startswith(f"{var}=")
    # GPUMEM_ALLOC_CONF set does not hide a bad torch variable: torch parses it too
    with pytest.raises(AllocConfError, match="PYTORCH_CUDA_ALLOC_CONF="):
        check_environment({"GPUMEM_ALLOC_CONF": "expandable_segments:True",
                           "PYTORCH_CUDA_ALLOC_CONF": text})


@pytest.mark.slow
def test_issue_34_settings_through_the_commands(tmp_path):
    """gpumem replay --conf and gpumem simulate (GPUMEM_ALLOC_CONF) exit 2
    with parse_conf's line, no traceback, nothing run."""
    import pickle
    import subprocess
    import sys
    snap = tmp_path / "s.pickle"
    snap.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))
    for text, _key, _fragment in ISSUE_34_REFUSED[:6]:
        with pytest.raises(ConfError) as ei:
            parse_conf(text)
        line = str(ei.value)
        for argv, env in ((["replay", str(snap), "--conf", text], {}),
                          (["simulate", "--out", str(tmp_path / "o"), "--", sys.executable,
                            "-c", "raise SystemExit(7)"], {"GPUMEM_ALLOC_CONF": text})):
            proc = subprocess.run([sys.executable, "-m", "gpumem", *argv], capture_output=True,
                                  text=True, timeout=120, env={**os.environ, **env})
            assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
            err = proc.stderr.strip()
            assert "\n" not in err and line in err and "Traceback" not in err, err


@pytest.mark.parametrize("text", ["expandable_segments", "expandable_segments True",
                                  "expandable_segments:True:False", "max_split_size_mb:64]"])
def test_malformed(text):
    with pytest.raises(ConfError) as ei:
        parse_conf(text)
    assert "\n" not in str(ei.value)


def test_conf_error_is_a_value_error():
    assert issubclass(ConfError, ValueError)


def test_combined_and_later_entry_wins():
    conf = parse_conf("expandable_segments:True, max_split_size_mb:128,"
                      "garbage_collection_threshold:0.8,roundup_power2_divisions:4,"
                      "max_split_size_mb:256,")
    assert conf == {
        "expandable_segments": True,
        "max_split_size": 256 * MiB,
        "garbage_collection_threshold": 0.8,
        "roundup_power2_divisions": [4] * 16,
    }


@pytest.mark.parametrize("text", [
    "",
    "expandable_segments:True",
    "expandable_segments:False",
    "max_split_size_mb:21",
    "garbage_collection_threshold:0.6",
    "garbage_collection_threshold:0.123456789",
    "roundup_power2_divisions:1",
    "roundup_power2_divisions:8",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "roundup_power2_divisions:[64:8,256:4]",
    "roundup_power2_divisions:[>:2]",
    "roundup_power2_divisions:[1:2,32768:4]",
    "roundup_power2_divisions:[4:4,8:0,>:4]",
    "expandable_segments:True,max_split_size_mb:512,garbage_collection_threshold:0.9,"
    "roundup_power2_divisions:[2:4,>:2]",
])
def test_format_round_trip(text):
    conf = parse_conf(text)
    canonical = format_conf(conf)
    assert parse_conf(canonical) == conf
    assert format_conf(parse_conf(canonical)) == canonical


def test_format_is_canonical():
    assert format_conf(default_conf()) == ""
    assert format_conf(parse_conf("expandable_segments:False")) == ""
    assert format_conf(parse_conf(" max_split_size_mb : 64 , expandable_segments:True")) == \
        "expandable_segments:True,max_split_size_mb:64"
    assert format_conf(parse_conf("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")) == \
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"
    assert format_conf(parse_conf("roundup_power2_divisions:[1:4,2:4,>:4]")) == \
        "roundup_power2_divisions:4"


def test_format_rejects_bad_dicts():
    for bad in ({"expandable_segments": 1}, {"max_split_size": 5},
                {"garbage_collection_threshold": 1.5},
                {"roundup_power2_divisions": [3] * 16},
                {"roundup_power2_divisions": [1] * 15}, {"colour": "blue"}):
        with pytest.raises(ConfError):
            format_conf(bad)


def test_settings_for_snapshot_shape():
    conf = parse_conf("expandable_segments:True,max_split_size_mb:64,"
                      "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    s = settings_for_snapshot(conf)
    assert s["PYTORCH_CUDA_ALLOC_CONF"] == format_conf(conf)
    assert s["expandable_segments"] is True
    assert s["max_split_size"] == 64 * MiB
    assert s["garbage_collection_threshold"] == 0.0
    keys = [str(1 << i) for i in range(16)]
    assert list(s["roundup_power2_divisions"]) == keys
    assert [s["roundup_power2_divisions"][k] for k in keys] == conf["roundup_power2_divisions"]
    assert settings_for_snapshot(default_conf())["max_split_size"] == -1


@pytest.mark.skipif(not REAL, reason=f"real snapshots not found at {SNAPSHOTS}")
def test_real_allocator_settings_agree():
    """Every settings string recorded in a real snapshot parses to the values torch recorded."""
    checked = 0
    for path in REAL:
        snap = load_snapshot(path)
        recorded = snap.get("allocator_settings")
        if not recorded:
            continue
        conf = parse_conf(recorded["PYTORCH_CUDA_ALLOC_CONF"])
        ours = settings_for_snapshot(conf)
        for key in ("max_split_size", "garbage_collection_threshold", "expandable_segments",
                    "roundup_power2_divisions"):
            assert ours[key] == recorded[key], (path.name, key)
        assert set(recorded) - {"PYTORCH_CUDA_ALLOC_CONF"} <= set(ours), path.name
        checked += 1
    assert checked > 0
