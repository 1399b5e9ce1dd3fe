"""The engine's profile is a valid cost-model profile (docs/profile-format.md) with sane figures."""

import torch

from specpilot_mem.costmodel.profile import Profile
from specpilot_mem.engine.engine import Engine
from specpilot_mem.engine.profile import profile_engine
from test_engine_core import SMALL, SMALL_DRAFTER


def test_profile_follows_the_cost_model_format():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: extra threads only spin on the shared CI machine
    engine = Engine.random(0, SMALL, SMALL_DRAFTER, max_len=256).with_options(positions=4)
    payload = profile_engine(engine, list(range(1, 41)), "H200", new_tokens=8, iters=2)
    profile = Profile.model_validate(payload)
    assert profile.synthetic and profile.nodes == 4 and profile.tau >= 1
    assert set(profile.kernels) == {"target_gemm", "gdn_recurrent", "attention", "lm_head", "drafter", "rest"}
    gemm = profile.kernels["target_gemm"]
    assert gemm.flops == 2 * 5 * gemm.bytes / 4  # float32 weights, 5 rows
    assert profile.T_step_ms > 0 and profile.T_AR_ms > 0
    torch.set_num_threads(before)
