"""Package map: `layouts/` and `kernels/` sit at the top of the repository (fixed layout) but
install as `tk_cute.layouts` and `tk_cute.kernels`, never as generic top-level names."""

from setuptools import find_packages, setup

ROOTS = {"tk_cute": "tk_cute", "tk_cute.layouts": "layouts", "tk_cute.kernels": "kernels"}
packages = []
for name, folder in ROOTS.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

# The emulator's C stand-in for the CUDA runtime is compiled at first use (tk_cute.emulator.launch).
setup(packages=packages, package_dir=ROOTS, package_data={"tk_cute.emulator": ["standin.c"]})
