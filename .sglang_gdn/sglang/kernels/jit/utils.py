import torch


def is_arch_support_pdl():
    return torch.cuda.is_available() and torch.version.hip is None and torch.cuda.get_device_capability()[0] >= 9
