from setuptools import find_packages, setup

setup(
    name="minitorch",
    version="0.1.0",
    description="A from-scratch deep-learning library with hand-written CUDA kernels",
    packages=find_packages(include=["minitorch", "minitorch.*"]),
    package_data={"minitorch": ["cuda_kernels/*.so"]},
    python_requires=">=3.10",
    install_requires=["numpy>=1.24", "numba>=0.58"],
    extras_require={"cuda": ["torch>=2.1"], "train": ["tokenizers>=0.15", "sacrebleu>=2.3", "tqdm>=4.60"]},
)
