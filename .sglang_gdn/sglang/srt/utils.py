import torch


def is_hip():
    return torch.version.hip is not None


def is_cuda():
    return torch.cuda.is_available() and torch.version.cuda is not None


def get_device_sm():
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def is_gfx95_supported():
    return False


def is_sm90_supported():
    cuda = tuple(int(p) for p in (torch.version.cuda or "0.0").split(".")[:2])
    return is_cuda() and torch.cuda.get_device_capability()[0] == 9 and cuda >= (12, 3)
