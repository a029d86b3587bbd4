import subprocess
from pathlib import Path

CONF = ["app/app.conf", "nginx/nginx.conf", "nginx/sites/default.conf"]


def test_nightly_backup_made():
    root = Path("/app/backups/nightly run")
    got = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert got == CONF


def test_script_counts_and_copies(tmp_path):
    out = subprocess.run(["/app/backup.sh", "check two"], capture_output=True, text=True, timeout=20)
    assert out.stdout.strip() == "3"
    assert (Path("/app/backups/check two/nginx/sites/default.conf")).read_text() == "listen 80;\n"
