"""`python -m tk_cute.bench {gemm,nvfp4,quantize} ...`"""

import importlib
import sys

BENCHES = {"gemm": "tk_cute.bench.gemm", "nvfp4": "tk_cute.bench.nvfp4",
           "quantize": "tk_cute.bench.quantize"}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHES:
        print(f"usage: python -m tk_cute.bench {{{','.join(BENCHES)}}} [options]", file=sys.stderr)
        return 2
    return importlib.import_module(BENCHES[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
