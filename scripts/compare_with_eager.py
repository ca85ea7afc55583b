"""Demo check: compare a package's saved outputs with the model run eagerly in this process.

usage: python scripts/compare_with_eager.py MODEL.py INPUT.npy OUTPUT.npz
"""

import sys

import numpy
import torch

from aotc.export.loading import load_model


def main(model_path: str, input_path: str, output_path: str) -> int:
    model = load_model(model_path).module
    x = torch.from_numpy(numpy.load(input_path))
    with torch.no_grad():
        expected = model(x)
    got = torch.from_numpy(numpy.load(output_path)["output_0"])
    diff = float((got - expected).abs().max())
    print(f"package vs eager on {input_path}: max abs difference {diff:.3g}")
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)
    sys.exit(main(*sys.argv[1:4]))
