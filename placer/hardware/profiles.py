"""Device profiles by name or path: the shipped ones, the defaults, the command-line options.

The profile document itself is ``placer.hardware.device_profile`` (its format in
profiles/README.md); the tools that measure one are ``placer.profiling``.

This module finds profiles by path or by the name of a shipped one, and names the
default (host, GPU) pair that ``placer plan net.pbtxt`` uses without options: the
2-core CI-like host and an NVIDIA V100 16 GB on PCIe 3 x16, the GPU generation Caffe2
was built and benchmarked on, whose small memory and slow link give the cautious plan
(a plan that pays off there pays off on newer parts; the reverse is not true).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from placer.errors import ProfileError
from placer.hardware.device_profile import DeviceProfile, Profile, load_profile

DEFAULT_CPU_PROFILE = "host-ci-2core"
DEFAULT_GPU_PROFILE = "v100-16gb-pcie3"


def shipped_profiles_dir() -> Path:
    """profiles/ beside the package (a checkout), else placer/profiles (an install)."""
    here = Path(__file__).resolve().parents[1]
    for candidate in (here.parent / "profiles", here / "profiles"):
        if candidate.is_dir():
            return candidate
    return here.parent / "profiles"


def shipped_profile_names() -> list[str]:
    return shipped_names(shipped_profiles_dir())


def shipped_names(folder: Path) -> list[str]:
    """The names of the shipped profiles in ``folder`` (file stems)."""
    return sorted(p.stem for p in folder.glob("*.json"))


def find_shipped(name_or_path: str | Path, folder: Path, what: str) -> Path:
    """A path as given, else the shipped ``<name>.json`` in ``folder`` (a bare name only);
    ``what`` names the kind of profile in the error."""
    path = Path(name_or_path)
    if path.exists():
        return path
    shipped = folder / f"{path.stem}.json"
    if shipped.exists() and path.parent == Path("."):
        return shipped
    raise ProfileError(f"{what} '{name_or_path}' not found",
                       hint=f"give a file, or one of: {', '.join(shipped_names(folder))}")


@dataclass(frozen=True)
class ShippedFolder:
    """One kind of shipped profile in its folder under profiles/ (``machines``, ``clusters``)."""

    folder: str
    what: str      # the kind of profile, as messages name it

    def path(self) -> Path:
        return shipped_profiles_dir() / self.folder

    def names(self) -> list[str]:
        return shipped_names(self.path())

    def find(self, name_or_path: str | Path) -> Path:
        """A path as given, else the shipped profile of that name (``find_shipped``)."""
        return find_shipped(name_or_path, self.path(), self.what)


def find_profile(name_or_path: str | Path) -> Path:
    """A path as given, else a shipped profile of that name."""
    return find_shipped(name_or_path, shipped_profiles_dir(), "profile")


def load_device_profile(name_or_path: str | Path, kind: str) -> DeviceProfile:
    """The ``kind`` device of a profile file (a single device or a pair)."""
    return load_profile(find_profile(name_or_path)).device(kind)


def default_profiles(cpu: str | Path | None = None, gpu: str | Path | None = None,
                     combined: str | Path | None = None) -> tuple[DeviceProfile, DeviceProfile]:
    """(cpu, gpu) device profiles: a combined file, else each file, else the defaults.

    A combined file supplies whichever devices it has; separate options override it.
    """
    pair: dict[str, DeviceProfile] = {}
    if combined:
        pair.update(load_profile(find_profile(combined)).devices)
    if cpu or "cpu" not in pair:
        pair["cpu"] = load_device_profile(cpu or DEFAULT_CPU_PROFILE, "cpu")
    if gpu or "gpu" not in pair:
        pair["gpu"] = load_device_profile(gpu or DEFAULT_GPU_PROFILE, "gpu")
    return pair["cpu"], pair["gpu"]


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """--profile / --cpu-profile / --gpu-profile for commands that price a net."""
    g = parser.add_argument_group("device profiles")
    g.add_argument("--profile", metavar="FILE",
                   help="one profile file holding a (cpu, gpu) pair")
    g.add_argument("--cpu-profile", metavar="FILE|NAME",
                   help=f"host profile (default: shipped '{DEFAULT_CPU_PROFILE}')")
    g.add_argument("--gpu-profile", metavar="FILE|NAME",
                   help=f"GPU profile (default: shipped '{DEFAULT_GPU_PROFILE}'; shipped: "
                        f"{', '.join(n for n in shipped_profile_names() if n != DEFAULT_CPU_PROFILE)})")


def profiles_from_args(args: argparse.Namespace) -> tuple[DeviceProfile, DeviceProfile]:
    return default_profiles(getattr(args, "cpu_profile", None), getattr(args, "gpu_profile", None),
                            getattr(args, "profile", None))


__all__ = ["DEFAULT_CPU_PROFILE", "DEFAULT_GPU_PROFILE", "DeviceProfile", "Profile",
           "add_profile_arguments", "default_profiles", "find_profile", "find_shipped", "load_device_profile",
           "load_profile", "profiles_from_args", "shipped_names", "shipped_profile_names", "shipped_profiles_dir"]
