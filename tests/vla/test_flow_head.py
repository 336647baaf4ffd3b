"""The flow-matching action expert: noise handle, tokens, stochastic sampler log-probabilities."""

import math

import numpy as np
import pytest
import torch

from vla.models.flow import FlowHeadConfig, FlowMatchingHead


@pytest.fixture
def head():
    torch.manual_seed(0)
    return FlowMatchingHead(FlowHeadConfig(horizon=4, action_dim=3, cond_dim=16, hidden=32, depth=2, num_tokens=4,
                                           num_steps=5))


def test_same_noise_same_actions_different_noise_different_actions(head):
    cond = torch.randn(2, 16)
    n1, n2 = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    a1, a1b, a2 = head.sample(cond, n1), head.sample(cond, n1.clone()), head.sample(cond, n2)
    assert a1.shape == (2, 4, 3)
    assert torch.equal(a1, a1b)
    assert not torch.allclose(a1, a2)


@pytest.mark.parametrize("shape", [(2, 4), (2, 3, 4), (1, 4, 3), (2, 4, 3, 1)])
def test_wrong_noise_shape_is_refused(head, shape):
    with pytest.raises(ValueError, match=r"noise must have shape \[B=2, H=4, A=3\]"):
        head.sample(torch.randn(2, 16), torch.randn(*shape))


def test_tokens_change_actions_and_are_range_checked(head):
    cond, noise = torch.randn(1, 16), torch.randn(1, 4, 3)
    assert torch.equal(head.sample(cond, noise), head.sample(cond, noise, token=0))  # 0 = null token
    assert not torch.allclose(head.sample(cond, noise, token=0), head.sample(cond, noise, token=3))
    with pytest.raises(ValueError, match="token must be in"):
        head.sample(cond, noise, token=5)


def test_stochastic_logprobs_are_the_gaussian_densities_of_the_sampled_transitions(head):
    cond = torch.randn(3, 16)
    sigma = 0.3
    g = torch.Generator().manual_seed(1)
    actions, chain, logp = head.sample_stochastic(cond, sigma=sigma, generator=g)
    assert chain.shape == (3, 6, 4, 3) and logp.shape == (3, 5)
    assert torch.equal(actions, chain[:, -1])
    # recompute each transition's density independently (float64 numpy, scipy-style formula)
    c = head._cond(cond, None)
    for k in range(5):
        t = torch.full((3,), 1.0 - k / 5)
        with torch.no_grad():
            mean = (chain[:, k] - 0.2 * head.velocity(chain[:, k], t, c)).double().numpy()
        x = chain[:, k + 1].double().numpy()
        if k == 4:  # deterministic last step: the action is the mean, log-prob 0
            np.testing.assert_allclose(x, mean, atol=1e-5)
            assert torch.all(logp[:, k] == 0)
            continue
        z = (x - mean) / sigma
        expected = (-0.5 * z**2 - math.log(sigma) - 0.5 * math.log(2 * math.pi)).reshape(3, -1).sum(-1)
        np.testing.assert_allclose(logp[:, k].double().numpy(), expected, rtol=1e-4, atol=1e-3)
    # the same chain re-evaluated under the same weights gives the same log-probs (ratio = 1)
    torch.testing.assert_close(head.chain_logprob(cond, chain, sigma=sigma), logp, rtol=1e-4, atol=1e-3)


def test_loss_trains_the_velocity_field():
    torch.manual_seed(0)
    h = FlowMatchingHead(FlowHeadConfig(horizon=2, action_dim=2, cond_dim=4, hidden=64, depth=2, num_steps=10))
    opt = torch.optim.Adam(h.parameters(), lr=3e-3)
    cond = torch.eye(4)[:2]  # two contexts, each with its own target chunk
    target = torch.tensor([[[0.5, -0.5], [0.5, -0.5]], [[-0.8, 0.2], [-0.8, 0.2]]])
    first = h.loss(cond, target).item()
    for _ in range(400):
        loss = h.loss(cond.repeat(32, 1), target.repeat(32, 1, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first * 0.3
    err = (h.sample(cond.repeat(16, 1)).reshape(16, 2, 2, 2) - target).abs().mean()
    assert err < 0.15, f"samples far from the demonstrated chunks: {err:.3f}"


def test_film_head_starts_as_the_plain_head_and_conditions_every_layer():
    """FlowHeadConfig(film=True): zero-initialised FiLM layers leave the velocity MLP as it is; once
    trained they modulate each hidden layer by the condition."""
    import torch

    from vla.models.flow import FlowHeadConfig, FlowMatchingHead

    torch.manual_seed(0)
    plain = FlowMatchingHead(FlowHeadConfig(horizon=4, action_dim=3, cond_dim=16, hidden=32, depth=3))
    film = FlowMatchingHead(FlowHeadConfig(horizon=4, action_dim=3, cond_dim=16, hidden=32, depth=3, film=True))
    film.load_state_dict(plain.state_dict(), strict=False)
    x, t, c = torch.randn(5, 4, 3), torch.rand(5), torch.randn(5, 16)
    torch.testing.assert_close(film.velocity(x, t, c), plain.velocity(x, t, c))
    assert len(film.films) == 3
    with torch.no_grad():
        film.films[2].weight.normal_()  # the last hidden layer now reads the condition
    assert not torch.allclose(film.velocity(x, t, c), plain.velocity(x, t, c))
    noise = torch.randn(5, 4, 3)
    torch.testing.assert_close(film.sample(c, noise=noise), film.sample(c, noise=noise))  # still deterministic
