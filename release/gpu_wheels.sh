#!/usr/bin/env bash
# Prepares .whl/ (git-ignored) with what the GPU machine lacks, for
# release/gpu_session.sh: that machine has Python 3.12 and PyTorch but no Ray
# and no package index, and a call carries at most 64 MiB. Run here, from
# anywhere, with the package index reachable:
#
#     bash release/gpu_wheels.sh && du -sh .whl
#
# Ray's wheel is over the limit alone: the copy here leaves out ray/jars/
# (Java workers), ray/rllib/ and the dashboard's .js.map files, none of which
# a Tune study loads. The versions are those installed here, so the GPU run
# measures the code the tests ran against.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl/raw

version() { python -c "import importlib.metadata as m; print(m.version('$1'))"; }
carried=(ray jsonschema jsonschema-specifications referencing rpds-py tensorboardX pydantic pydantic-core
         annotated-types typing-inspection)
pinned=()
for name in "${carried[@]}"; do pinned+=("$name==$(version "$name")"); done
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl/raw "${pinned[@]}"
python -m pip wheel -q --no-deps --no-build-isolation -w .whl/raw .  # ray_stagetree itself

python - <<'EOF'
import base64, hashlib, pathlib, zipfile

def dropped(name: str) -> bool:
    return name.startswith(("ray/jars/", "ray/rllib/")) or (name.startswith("ray/dashboard/") and name.endswith(".map"))

for wheel in pathlib.Path(".whl/raw").glob("*.whl"):
    target = pathlib.Path(".whl") / wheel.name
    if not wheel.name.startswith("ray-"):
        wheel.rename(target)
        continue
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
        record_name = next(name for name in source.namelist() if name.endswith(".dist-info/RECORD"))
        kept = [info for info in source.infolist() if not dropped(info.filename) and info.filename != record_name]
        rows = []
        for info in kept:
            data = source.read(info)
            out.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{info.filename},sha256={digest},{len(data)}")
        out.writestr(record_name, "\n".join(rows + [f"{record_name},,"]) + "\n")
    wheel.unlink()
EOF
rm -rf .whl/raw
ls -la .whl
total=$(du -sm .whl | cut -f1)
echo "carried wheels: ${total} MiB (a call carries at most 64 MiB with the working tree)"
