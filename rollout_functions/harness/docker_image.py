"""The docker provider's base image, made offline from this file alone: no registry, no Dockerfile.

The image is one layer holding only directories: Harbor's `/app`, `/tests`, `/logs`, a `/tmp`,
`/usr` and `/etc` (where a container borrows the host's read-only; Docker makes the other mount
points, the project checkout and Python's installation, see docker.py) and merged-/usr's `/bin`,
`/lib`, `/lib64` symlinks. So bash, coreutils, python3, node and the agent programs under `.cache/agents` are the
host's own, at the host's paths, without copying gigabytes into a layer; the container's writes
land in its own layer. `/sbin` is a directory (Docker mounts its init there), `/usr/sbin` on PATH.

The archive is `docker load`'s format (manifest.json, the config, the layer) with fixed times and
modes, so the same files make the same bytes and the same image id; its tag is the config's hash,
and loading takes well under a second, so every run loads it when the daemon lacks it.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile

REPOSITORY = "slimeish-sandbox"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
DIRECTORIES = (
    *("app", "tests", "logs", "logs/agent", "logs/verifier", "tmp", "run", "root", "sbin", "var", "etc"),
    *("usr", "proc", "dev", "sys", "slimeish-net"),
)
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}  # the kernel's names, in OCI's
SYMLINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64"}


def _tar(entries: list[tarfile.TarInfo], data: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info in entries:
            info.mtime, info.uname, info.gname = 0, "root", "root"
            body = data.get(info.name)
            if body is not None:
                info.size = len(body)
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    return buf.getvalue()


def _layer() -> bytes:
    entries = []
    for name in DIRECTORIES:
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
        entries.append(info)
    for name, target in SYMLINKS.items():
        info = tarfile.TarInfo(name)
        info.type, info.linkname = tarfile.SYMTYPE, target
        entries.append(info)
    return _tar(entries, {})


def image_archive() -> tuple[str, bytes]:
    """The image's tag (`slimeish-sandbox:<hash>`) and its `docker load` archive."""
    layer = _layer()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": ARCHITECTURES.get(platform.machine(), platform.machine()),
        "os": "linux",
        "config": {"Env": [f"PATH={PATH}"], "WorkingDir": "/app", "Cmd": ["sleep", "infinity"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_hash = hashlib.sha256(config_bytes).hexdigest()
    tag = f"{REPOSITORY}:{config_hash[:16]}"
    layer_path = f"{diff_id.removeprefix('sha256:')}/layer.tar"
    manifest = [{"Config": f"{config_hash}.json", "RepoTags": [tag], "Layers": [layer_path]}]
    files = {layer_path: layer, f"{config_hash}.json": config_bytes, "manifest.json": json.dumps(manifest).encode()}
    return tag, _tar([tarfile.TarInfo(name) for name in files], files)
