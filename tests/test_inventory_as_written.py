"""Inventory values arrive as written (issue 20, item 5). YAML 1.1 rewrites plain scalars: `0123` is 83,
`12:30` is 750, `yes` is true, `22:22` is 1342, `0x1F` is 31, `~` is null. meshrun reads every value as the
file writes it: an `env` value reaches the host exactly so, text stays text, and a number is plain ASCII
decimal digits or a one-line refusal. Every case here loaded a rewritten value (or refused a good one) before.

The env values go from the YAML through `env_block` to a real child process started the way the check's
all-reduce starts torchrun (EXEC_WITH_STDIN_ENV); tests/test_secrets.py proves on the simulated cluster that
the same block reaches every worker unchanged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from meshrun.deploy.edges.stdinfeed import EXEC_WITH_STDIN_ENV
from meshrun.deploy.errors import InputError
from meshrun.deploy.inventory.load import load_inventory
from meshrun.deploy.run.plan import env_block

# (as written in a flow mapping, what the host must get); YAML 1.1's reading in the comment
ENV = [
    ("0123", "0123"),  # 83 (octal)
    ("12:30", "12:30"),  # 750 (sexagesimal)
    ("yes", "yes"), ("off", "off"), ("True", "True"),  # booleans
    ("1_000", "1_000"), ("0x10", "0x10"), ("0o17", "0o17"), ("+5", "+5"), ("007", "007"),  # 1000, 16, 15, 5, 7
    ("1.50", "1.50"), ("1e3", "1e3"), (".inf", ".inf"), (".NaN", ".NaN"),  # 1.5, 1000.0, inf, nan
    ("~", "~"), ("null", "null"), ("NULL", "NULL"),  # None
    ("2020-01-01", "2020-01-01"),  # a date
    ("'0123'", "0123"), ('"a\\tb"', "a\tb"), ("''", ""),  # quoted: their value
]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    return path


def env_inventory(tmp_path: Path) -> Path:
    pairs = ", ".join(f"V{i}: {written}" for i, (written, _) in enumerate(ENV))
    return write(tmp_path, "hosts:\n  a:\n    address: 10.0.0.1\n    env: {" + pairs + ", ON: 1}\n"
                           "    batch_size: 8\n  b:\n    address: 10.0.0.2\n    env:\n      PEM: |\n        line1\n"
                           "        line2\n      FOLDED: a\n        b\n")


def test_env_values_reach_the_env_block_as_written(tmp_path: Path) -> None:
    a, b = load_inventory(env_inventory(tmp_path)).hosts
    expected = {f"V{i}": value for i, (_, value) in enumerate(ENV)} | {"ON": "1"}  # `ON:` is the name ON, not true
    assert a.env == tuple(expected.items())
    assert env_block(a) == json.dumps(expected, separators=(",", ":")).encode() + b"\n"
    assert b.env == (("PEM", "line1\nline2\n"), ("FOLDED", "a b"))  # YAML's own block and folding rules


def test_env_values_reach_a_real_process_as_written(tmp_path: Path) -> None:
    """The real stdin helper under a real python: the child's environment holds the text of the file."""
    host = load_inventory(env_inventory(tmp_path)).hosts[0]
    done = subprocess.run([sys.executable, "-c", EXEC_WITH_STDIN_ENV, sys.executable, "-c",
                           "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k[0] in 'VO'}))"],
                          input=env_block(host), capture_output=True, check=True)
    got = json.loads(done.stdout)
    assert {k: got[k] for k, _ in host.env} == {f"V{i}": value for i, (_, value) in enumerate(ENV)} | {"ON": "1"}


def test_text_and_names_are_kept_as_written(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "hosts:\n  1: {address: 10.0.0.1, user: 0123, port: 022, python: 3.10}\n"
                                         "  yes: {address: 10.0.0.2, gpus: [007, 1]}\n"
                                         "groups:\n  0123: [1, yes]\n"))
    one, yes = inv.hosts
    assert (one.name, one.user, one.port, one.python) == ("1", "0123", 22, "3.10")  # port 022: decimal, not 18
    assert (yes.name, yes.gpus) == ("yes", (7, 1))
    assert dict(inv.groups) == {"0123": ("1", "yes")}


NUMBER = "expected a port number, got text {}; write a number from 1 to 65535"
WHOLE = "expected a whole number, got text {}; write a number from 1 to 1024"


@pytest.mark.parametrize("fields,expected", [
    ("port: 22:22", "field 'port': " + NUMBER.format("'22:22'")),  # YAML 1.1: 1342
    ("port: 0x1F", "field 'port': " + NUMBER.format("'0x1F'")),  # 31
    ("port: 2_222", "field 'port': " + NUMBER.format("'2_222'")),  # 2222
    ("port: +22", "field 'port': " + NUMBER.format("'+22'")),  # 22
    ("port: 22.0", "field 'port': " + NUMBER.format("'22.0'")),  # a float
    ("port: ~", "field 'port': " + NUMBER.format("'~'")),
    ("port: ", "field 'port': expected a port number, got nothing; write a number from 1 to 65535"),
    ("nproc: 0x2", "field 'nproc': " + WHOLE.format("'0x2'")),
    ("nproc: 1:00", "field 'nproc': " + WHOLE.format("'1:00'")),  # 60
    ("nproc: yes", "field 'nproc': " + WHOLE.format("'yes'")),  # true
    ("batch_size: 0x20", "field 'batch_size': expected a number >= 1 or `auto`, got '0x20'; "
                         "write e.g. `batch_size: 32` or `batch_size: auto`"),
    ("batch_size: 1_024", "field 'batch_size': expected a number >= 1 or `auto`, got '1_024'; "
                          "write e.g. `batch_size: 32` or `batch_size: auto`"),
    ("gpus: [0, 0x1]", "field 'gpus': GPU index '0x1' is not a whole number; write indices as nvidia-smi shows them: 0, 1, ..."),
    ("gpus: [0, 1:0]", "field 'gpus': GPU index '1:0' is not a whole number; write indices as nvidia-smi shows them: 0, 1, ..."),
    ("gpus: [true]", "field 'gpus': GPU index 'true' is not a whole number; write indices as nvidia-smi shows them: 0, 1, ..."),
    ("user: ~", "field 'user': expected non-empty text, got ~, which YAML reads as null; write a non-empty string "
                "(quoted, '~', if you mean that text)"),
    ("workdir: null", "field 'workdir': expected non-empty text, got null, which YAML reads as null; write a non-empty "
                      "string (quoted, 'null', if you mean that text)"),
    ("python: ", "field 'python': expected non-empty text, got nothing; write a non-empty string"),
    ("env: {A: }", "field 'env.A': expected a value, got nothing; write it as text, e.g. OMP_NUM_THREADS: \"1\" (or \"\")"),
])
def test_a_value_yaml_would_retype_is_refused_in_one_line(tmp_path: Path, fields: str, expected: str) -> None:
    path = write(tmp_path, "hosts:\n  a: {address: 10.0.0.1, " + fields + "}\n")
    with pytest.raises(InputError) as info:
        load_inventory(path)
    assert str(info.value) == f"{path}:2: host 'a', {expected}"


@pytest.mark.parametrize("section,expected", [
    ("rendezvous: {port: 29_400}", "3: field 'rendezvous.port': " + NUMBER.format("'29_400'")),
    ("rendezvous: {port: 8:10}", "3: field 'rendezvous.port': " + NUMBER.format("'8:10'")),  # 490
    ("elastic: {min: 0b1, max: 2}", "3: field 'elastic.min': " + WHOLE.replace("1024", "10000").format("'0b1'")),
    ("elastic: {min: 1, max: 0x3}", "3: field 'elastic.max': " + WHOLE.replace("1024", "10000").format("'0x3'")),
])
def test_top_level_numbers_too(tmp_path: Path, section: str, expected: str) -> None:
    path = write(tmp_path, "hosts:\n  a: {address: 10.0.0.1}\n" + section + "\n")
    with pytest.raises(InputError) as info:
        load_inventory(path)
    assert str(info.value) == f"{path}:{expected}"
