"""How much the Megatron-LM functional-test oracle moves between Megatron-LM versions on the same platform, and
whether that explains the projection's miss (docs/performance.md, "Megatron-LM functional tests").

Run: python3 benchmarks/functional_drift.py        (needs ../shared/fixtures/megatron for the scored snapshot)

VERSIONS: other stored versions of `tests/functional_tests/test_cases/<gpt|moe>/<case>/golden_values_dev_dgx_h100.json`
(GitHub repository and commit given, so each can be fetched and checked) with the median of their `iteration-time`
over steps >= 3, read 2026-11-29 through the public-code index (2-4 versions per case reachable there, fixture
included; the index holds more). Versions whose values equal the fixture's are listed too and counted once. The scored
test (tests/oracle/test_performance_megatron.py) keeps the fixture snapshot (Megatron-LM d98e8a64): choosing a version
by its error would be fitting. This script only reports the spread and the error against the fastest and the slowest
version of each case.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from projection import api  # noqa: E402
from tests.oracle.megatron_cases import MEGATRON, cases  # noqa: E402

# case -> (repository, commit, median iteration-time over steps >= 3 in s)
VERSIONS: dict[str, list[tuple[str, str, float]]] = {
    "gpt3_7b_tp1_pp4_memory_speed": [
        ("NVIDIA/Megatron-LM", "070712a0bf439eb310ca4f2c16d9446f1ddc5b8f", 1.06056),
        ("NVIDIA/Megatron-LM", "d3fbbcad6146571e55020e7f5db89e0a0aa947ae", 1.18256),
    ],
    "gpt3_mcore_te_tp1_pp1_resume_torch_dist_dist_optimizer": [
        ("NVIDIA/Megatron-LM", "3c13e61305df61aef4ad778ad3e9f2934b6a7ccb", 0.057765),
        ("NVIDIA/Megatron-LM", "57394d249e4571e95116459bf19e82a53c76b54d", 0.06742),
    ],
    "gpt3_mcore_te_tp1_pp4_resume_torch_dist_disable_bias_linear": [
        ("NVIDIA/Megatron-LM", "08165aba2f247b3e01b2e10f7d8f63c3b20f71a7", 0.08971),
        ("NVIDIA/Megatron-LM", "acb150e84708c78adeaf974bb21a26846a4fce54", 0.08663),
        ("svcnemo-autobot/Megatron-LM", "37b95c51a9883f8b852ed586160f06345ad7d946", 0.11968),
    ],
    "gpt3_mcore_te_tp1_pp4_vp1": [
        ("NVIDIA/Megatron-LM", "08165aba2f247b3e01b2e10f7d8f63c3b20f71a7", 0.095105),
        ("NVIDIA/Megatron-LM", "c7b0626a1d9c4760377b83ae2459c212aa5ea3cb", 0.08925),
    ],
    "gpt3_mcore_te_tp1_pp4_vp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce": [
        ("NVIDIA/Megatron-LM", "08165aba2f247b3e01b2e10f7d8f63c3b20f71a7", 0.08696),
        ("NVIDIA/Megatron-LM", "c7b0626a1d9c4760377b83ae2459c212aa5ea3cb", 0.081725),
        ("svcnemo-autobot/Megatron-LM", "37b95c51a9883f8b852ed586160f06345ad7d946", 0.113115),
    ],
    "gpt3_mcore_te_tp2_pp1_resume_torch_dist_cp2_nondeterministic": [
        ("NVIDIA/Megatron-LM", "7f2bc4ffdc085fa7f07c6944dd6331ebc09ed5e5", 0.278885),
    ],
    "gpt3_mcore_te_tp2_pp2_cp2_calculate_per_token_loss_nondeterministic": [
        ("NVIDIA/Megatron-LM", "489d4ad21a7bbfb17244fe1ed1faa89f227ebeeb", 0.29588),
        ("NVIDIA/Megatron-LM", "e176a65797e4ed0ca80a859b13ed606222e01bf0", 0.28819),
    ],
    "gpt3_mcore_te_tp2_pp2_cp2_etp4_nondeterministic_dp_last": [
        ("NVIDIA/Megatron-LM", "5bd8d2838802dbe2656983afd0ed440f12ed7437", 0.29382),
        ("NVIDIA/Megatron-LM", "6df14fa6c4090c6696da4e13dc053c772cacb43d", 0.28106),
    ],
    "gpt3_mcore_te_tp2_pp2_resume_torch_dist": [
        ("NVIDIA/Megatron-LM", "08165aba2f247b3e01b2e10f7d8f63c3b20f71a7", 0.135195),
        ("NVIDIA/Megatron-LM", "722c5cd3778406d3b3490d4b2935bf22e2dac663", 0.12356),
        ("svcnemo-autobot/Megatron-LM", "37b95c51a9883f8b852ed586160f06345ad7d946", 0.193745),
    ],
    "gpt3_mcore_te_tp2_pp2_resume_torch_dist_defer_embedding_wgrad_compute": [
        ("NVIDIA/Megatron-LM", "08165aba2f247b3e01b2e10f7d8f63c3b20f71a7", 0.13705),
        ("NVIDIA/Megatron-LM", "84a15e6d9071e202c3aeac0164dcaec917ae77e0", 0.125865),
        ("svcnemo-autobot/Megatron-LM", "37b95c51a9883f8b852ed586160f06345ad7d946", 0.13728),
    ],
    "gpt3_mcore_te_tp4_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce": [
        ("NVIDIA/Megatron-LM", "08165aba2f247b3e01b2e10f7d8f63c3b20f71a7", 0.200545),
        ("NVIDIA/Megatron-LM", "419da0f5bd81cd72b43736d4e242d6a84c67ba11", 0.212865),
        ("svcnemo-autobot/Megatron-LM", "37b95c51a9883f8b852ed586160f06345ad7d946", 0.19604),
    ],
    "gpt3_mcore_tp1_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce_param_gather": [
        ("NVIDIA/Megatron-LM", "01b9cb2335333fbcf86470211c6b955fa6f0665d", 0.050265),
        ("NVIDIA/Megatron-LM", "887c851cb39c2a70db04156b5688ced0a427a728", 0.06905),
    ],
    "gpt3_mcore_tp4_pp1_resume_torch_dist": [
        ("NVIDIA/Megatron-LM", "0eebdbad8dd883746515e10af6a5b1888458b112", 0.191775),
        ("NVIDIA/Megatron-LM", "dd124fbc058c41e0d922c139b4c340ac3942584e", 0.216655),
    ],
    "gpt3_mcore_cp2_pp2_ep2_te_4experts2parallel_nondeterministic": [
        ("NVIDIA/Megatron-LM", "3a0a37ea2a4852031e84f318d34495403f23f5f2", 0.265475),
        ("NVIDIA/Megatron-LM", "4ad3f2f4e025033d755eca8f041586cbd25ce9cc", 0.243185),
    ],
    "gpt3_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_dist_optimizer": [
        ("NVIDIA/Megatron-LM", "08165aba2f247b3e01b2e10f7d8f63c3b20f71a7", 0.212925),
        ("NVIDIA/Megatron-LM", "887c851cb39c2a70db04156b5688ced0a427a728", 0.240895),
    ],
    "gpt3_mcore_te_tp2_pp1_te_a2a_ovlp_8experts_etp1_ep4": [
        ("NVIDIA/Megatron-LM", "2968fd464556cecf2bcede5ce1400aa4e6e7aa5a", 0.288005),
        ("NVIDIA/Megatron-LM", "72a2714a40e663b25a37de40af037fe9b78814ba", 0.305685),
    ],
    "gpt3_mcore_tp2_cp2_pp2_ep2_te_4experts2parallel": [
        ("NVIDIA/Megatron-LM", "043182421f6811c3b98860d2bac0761bd16f5c9a", 0.50052),
        ("NVIDIA/Megatron-LM", "1bc066da0594e82131d5850942154dd3f540e05b", 0.461535),
    ],
    "gpt3_mcore_tp2_pp2_ep2_te_4experts2parallel": [
        ("NVIDIA/Megatron-LM", "050527d5a3cd318a1b4c450d74abb93ecde06a0c", 0.23192),
        ("NVIDIA/Megatron-LM", "bcac25ec0f6b10107591c3490d8129cb42412803", 0.23264),
    ],
    "gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading": [
        ("NVIDIA/Megatron-LM", "09eb91e5752df401e05645fea9c2721d8e765971", 1.88245),
        ("NVIDIA/Megatron-LM", "fb946948f37a43e4ef2da43760e40f892fa3a91e", 1.89752),
    ],
}


def spread() -> dict[str, list[float]]:
    """Distinct medians per case, the fixture's first."""
    out: dict[str, list[float]] = {c.name: [c.iteration_s] for c in cases()}
    for case, versions in VERSIONS.items():
        for _repo, _commit, median in versions:  # equal to a listed value within rounding: the same file
            if case in out and all(abs(median / v - 1.0) > 1e-4 for v in out[case]):
                out[case].append(median)
    return out


def main() -> int:
    from projection.perf import default_cost_model, project

    if not (MEGATRON / "CASES.md").is_file():
        print("shared/fixtures/megatron absent: nothing to compare")
        return 0
    by_case = spread()
    found = {c.name: c for c in cases()}
    errors: dict[str, list[float]] = {"fixture": [], "fastest": [], "slowest": []}
    ratios = []
    print(f"{'case':<86} {'versions':>8} {'max/min':>8} {'projected s':>11} {'err fixture':>11} {'err fastest':>11}")
    for name, medians in by_case.items():
        c = found[name]
        sc = api.load(MEGATRON / name / "model_config.yaml", nodes=c.nodes, gpus_per_node=c.gpus_per_node,
                      hardware="h100-sxm")
        step = project(sc, default_cost_model(sc)).step_time_s
        ratios += [m / medians[0] for m in medians[1:]]
        for label, ref in (("fixture", medians[0]), ("fastest", min(medians)), ("slowest", max(medians))):
            errors[label].append(abs(step / ref - 1.0))
        print(f"{name:<86} {len(medians):>8} {max(medians) / min(medians):>8.2f} {step:>11.4f} "
              f"{step / medians[0] - 1:>+11.1%} {step / min(medians) - 1:>+11.1%}")
    spreads = [max(m) / min(m) for m in by_case.values()]
    print(f"\n{len(ratios)} other distinct versions; spread per case (max/min) {min(spreads):.2f}-{max(spreads):.2f}, "
          f"median {statistics.median(spreads):.2f}; within 10 % of the fixture: "
          f"{sum(abs(r - 1) <= 0.10 for r in ratios)} of {len(ratios)}")
    print("median |error| against the fixture {:.1%}, the fastest version {:.1%}, the slowest {:.1%}".format(
        *(statistics.median(errors[k]) for k in ("fixture", "fastest", "slowest"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
