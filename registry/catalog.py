"""The platform's base images, seeded by migration 0002 and by ``seed_demo``.

PyTorch, TensorFlow and PaddlePaddle, each for JupyterLab, VS Code (code-server) and
training; and three inference servers for model services (vLLM's OpenAI-compatible server,
NVIDIA Triton Inference Server, Hugging Face Text Generation Inference). The Jupyter
images are the Jupyter Docker Stacks' CUDA builds; the code-server variants are Camp's thin
layers over the same bases (docs/WORKLOADS.md says how to build them); the training images
are the frameworks' own. Admins may edit or disable any of them.
"""

from __future__ import annotations

from typing import Any

BASE_IMAGES: list[dict[str, Any]] = [
    {"name": "pytorch-jupyter", "display_name": "PyTorch · JupyterLab", "framework": "pytorch",
     "variant": "jupyter", "reference": "quay.io/jupyter/pytorch-notebook:cuda12-2024-10-07"},
    {"name": "pytorch-vscode", "display_name": "PyTorch · VS Code", "framework": "pytorch",
     "variant": "vscode", "reference": "ghcr.io/camp-platform/pytorch-code-server:2.4.1-cuda12.1"},
    {"name": "pytorch-ssh", "display_name": "PyTorch · SSH", "framework": "pytorch",
     "variant": "ssh", "reference": "ghcr.io/camp-platform/pytorch-sshd:2.4.1-cuda12.1"},
    {"name": "pytorch-training", "display_name": "PyTorch · training", "framework": "pytorch",
     "variant": "training", "reference": "docker.io/pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime"},
    {"name": "tensorflow-jupyter", "display_name": "TensorFlow · JupyterLab", "framework": "tensorflow",
     "variant": "jupyter", "reference": "quay.io/jupyter/tensorflow-notebook:cuda-2024-10-07"},
    {"name": "tensorflow-vscode", "display_name": "TensorFlow · VS Code", "framework": "tensorflow",
     "variant": "vscode", "reference": "ghcr.io/camp-platform/tensorflow-code-server:2.17.0-gpu"},
    {"name": "tensorflow-training", "display_name": "TensorFlow · training", "framework": "tensorflow",
     "variant": "training", "reference": "docker.io/tensorflow/tensorflow:2.17.0-gpu"},
    {"name": "paddle-jupyter", "display_name": "PaddlePaddle · JupyterLab", "framework": "paddle",
     "variant": "jupyter", "reference": "ghcr.io/camp-platform/paddle-notebook:2.6.1-gpu-cuda12.0"},
    {"name": "paddle-vscode", "display_name": "PaddlePaddle · VS Code", "framework": "paddle",
     "variant": "vscode", "reference": "ghcr.io/camp-platform/paddle-code-server:2.6.1-gpu-cuda12.0"},
    {"name": "paddle-training", "display_name": "PaddlePaddle · training", "framework": "paddle",
     "variant": "training",
     "reference": "docker.io/paddlepaddle/paddle:2.6.1-gpu-cuda12.0-cudnn8.9-trt8.6"},
    # Model services (workspaces.ModelService): health paths are each server's own —
    # vLLM /health on 8000, Triton /v2/health/ready on 8000, TGI /health on 80 (docs/SERVING.md).
    {"name": "vllm", "display_name": "vLLM · OpenAI-compatible server", "framework": "other",
     "variant": "inference", "reference": "docker.io/vllm/vllm-openai:v0.6.3"},
    {"name": "triton", "display_name": "NVIDIA Triton Inference Server", "framework": "other",
     "variant": "inference", "reference": "nvcr.io/nvidia/tritonserver:24.10-py3"},
    {"name": "tgi", "display_name": "Hugging Face Text Generation Inference", "framework": "other",
     "variant": "inference", "reference": "ghcr.io/huggingface/text-generation-inference:2.4.0"},
]


# How the base images run (registry.Image.run_as_user/run_as_group/home): the Jupyter Docker
# Stacks' jovyan (uid 1000, gid 100), code-server's coder (1000:1000); sshd starts as root and
# drops to the user; the frameworks' training and inference images run as their own USER.
RUN_AS: dict[str, dict[str, Any]] = {
    "jupyter": {"run_as_user": 1000, "run_as_group": 100, "home": "/home/jovyan"},
    "vscode": {"run_as_user": 1000, "run_as_group": 1000, "home": "/home/coder"},
}
for _entry in BASE_IMAGES:
    _entry.update(RUN_AS.get(_entry["variant"], {}))


def seed_base_images(image_model: Any) -> int:
    """Create the missing base images (idempotent; edited ones are left alone)."""
    created = 0
    fields = {f.name for f in image_model._meta.get_fields()}
    for entry in BASE_IMAGES:
        _, made = image_model.objects.get_or_create(
            scope="platform", tenant=None, project=None, name=entry["name"],
            # Only the fields the model has (migrations seed through historical models).
            defaults={k: v for k, v in entry.items() if k != "name" and k in fields},
        )
        created += int(made)
    return created
