"""Runs INT8 models in a process of their own that imports only numpy and the runtime, so that what a
test puts around it (valgrind's CPUID, oneDNN's ISA cap) holds from the start, and stays quick
under valgrind:

    python int8_outputs.py onnxruntime|openvino FRAMES.npz OUT.npz MODEL...

FRAMES.npz holds the graph inputs (images, state); OUT.npz gets model i's outputs as "i-<name>".
Prints the CPU features numpy sees, as JSON.
"""

import json
import sys

import numpy as np

from numpy._core._multiarray_umath import __cpu_features__  # numpy ≥ 2, as the dev environment has


def outputs_of(runtime: str, model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if runtime == "onnxruntime":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        names = [output.name for output in session.get_outputs()]
        return dict(zip(names, session.run(names, feeds)))
    import openvino

    # As OpenVinoBackend compiles an INT8 model for the CPU (float ops in f32), on one thread.
    compiled = openvino.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                            "INFERENCE_NUM_THREADS": 1})
    results = compiled(feeds)
    return {output.any_name: np.asarray(results[output]) for output in compiled.outputs}


if __name__ == "__main__":
    runtime, frames, out, *models = sys.argv[1:]
    feeds = dict(np.load(frames))
    np.savez(out, **{f"{i}-{name}": array for i, model in enumerate(models)
                     for name, array in outputs_of(runtime, model, feeds).items()})
    print(json.dumps({name: bool(seen) for name, seen in __cpu_features__.items()}))
