"""The checked-in generated module matches a fresh protoc run, and --check notices drift."""

import shutil
import subprocess
import sys
from pathlib import Path

from proto import generate

ROOT = Path(__file__).resolve().parents[1]


def test_generated_code_is_up_to_date():
    result = subprocess.run([sys.executable, "-m", "proto.generate", "--check"], cwd=ROOT, check=False,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_reports_a_stale_module(tmp_path):
    for name in generate.GENERATED:
        shutil.copy(generate.PROTO_DIR / name, tmp_path / name)
    assert generate.stale_files(tmp_path) == {}
    stale = tmp_path / "tidegate_pb2.py"
    stale.write_text(stale.read_text().replace("tidegate.v1", "tidegate.v0"))
    diffs = generate.stale_files(tmp_path)
    assert set(diffs) == {"tidegate_pb2.py"}
    assert any(line.startswith("+") and "tidegate.v1" in line for line in diffs["tidegate_pb2.py"])


def test_check_mode_exits_non_zero_with_a_summary(monkeypatch, capsys):
    monkeypatch.setattr(generate, "stale_files", lambda: {"tidegate_pb2.py": ["--- a", "+++ b", "-old", "+new"]})
    assert generate.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "tidegate_pb2.py is stale (2 changed lines)" in out and "python -m proto.generate" in out
