import math

import pytest

from verifier.errors import InvalidParams
from verifier.theory import expected_tokens, optimal_gamma, simulate_rounds, speedup


def test_omega_closed_form_and_limits():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert math.isclose(expected_tokens(0.5, 2), 1 + 0.5 + 0.25)
    assert math.isclose(expected_tokens(0.8, 4), sum(0.8**i for i in range(5)))


def test_speedup_matches_leviathan_formula():
    # Leviathan et al. 2023, Thm 3.8: (1 - α^(γ+1)) / ((1 - α)(γc + 1))
    alpha, gamma, c = 0.8, 3, 0.05
    assert math.isclose(speedup(alpha, gamma, c), (1 - alpha**4) / ((1 - alpha) * (gamma * c + 1)))
    assert math.isclose(speedup(alpha, gamma, c, verify_cost=2.0), expected_tokens(alpha, gamma) / (gamma * c + 2))


def test_optimal_gamma_grows_with_alpha_and_shrinks_with_cost():
    assert optimal_gamma(0.9, 0.05) > optimal_gamma(0.6, 0.05)
    assert optimal_gamma(0.8, 0.01) >= optimal_gamma(0.8, 0.2)
    g = optimal_gamma(0.8, 0.05)
    assert speedup(0.8, g, 0.05) >= max(speedup(0.8, x, 0.05) for x in range(1, 33))


@pytest.mark.parametrize("alpha,gamma", [(0.3, 2), (0.7, 4), (0.9, 8)])
def test_simulator_converges_to_omega(alpha, gamma):
    sim = simulate_rounds(alpha, gamma, rounds=100_000, seed=1)
    # std of tokens/round <= gamma+1, so 100k rounds give a standard error < 0.03
    assert abs(sim.running_mean[-1] - expected_tokens(alpha, gamma)) < 0.03
    assert sim.tokens_per_round.min() >= 1 and sim.tokens_per_round.max() <= gamma + 1


def test_theory_rejects_bad_inputs():
    with pytest.raises(InvalidParams):
        expected_tokens(1.5, 2)
    with pytest.raises(InvalidParams):
        simulate_rounds(0.5, 2, rounds=0)
    with pytest.raises(InvalidParams):
        speedup(0.5, 2, cost=-1)


def test_alpha_from_omega_inverts_omega():
    from verifier.theory import alpha_from_omega

    for alpha in (0.0, 0.3, 0.77, 0.99):
        assert abs(alpha_from_omega(expected_tokens(alpha, 4), 4) - alpha) < 1e-6
    with pytest.raises(InvalidParams):
        alpha_from_omega(7.0, 4)
