"""Hardware profiles: every bundled file loads, every fitted constant sits in its sourced range, and every
kind of bad file is one UserError sentence that names the file and the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simulator.errors import UserError
from simulator.hardware import PROFILES_DIR, UNITS, HardwareProfile, list_hardware, load_hardware

BUNDLED = ("b200", "gb200", "gb300", "h100", "h200")
H200_TEXT = (PROFILES_DIR / "h200.toml").read_text(encoding="utf-8")


def test_bundled_profiles_are_listed() -> None:
    assert set(BUNDLED) <= set(list_hardware())


@pytest.mark.parametrize("name", list_hardware())
def test_every_bundled_profile_loads_with_a_source_per_constant(name: str) -> None:
    hw = load_hardware(name)
    assert isinstance(hw, HardwareProfile)
    assert set(hw.sources) == set(UNITS)
    assert all(text.strip() for text in hw.sources.values())


@pytest.mark.parametrize("name", list_hardware())
def test_every_fitted_constant_lies_inside_its_sourced_range(name: str) -> None:
    hw = load_hardware(name)
    assert 1 <= len(hw.fits) <= 6, "a handful of fitted constants at most"
    for key, fit in hw.fits.items():
        assert fit.low <= getattr(hw, key) <= fit.high, key
        assert fit.fitted_to.strip() and fit.range_source.strip(), key


@pytest.mark.parametrize("name", list_hardware())
def test_physical_relations_hold(name: str) -> None:
    hw = load_hardware(name)
    no_pdl = "no PDL" in hw.sources["launch_gap_pdl_us"]  # ROCm (mi300x, mi355x): a PDL kernel waits it all
    assert hw.launch_gap_pdl_us == hw.launch_gap_us if no_pdl else hw.launch_gap_pdl_us < hw.launch_gap_us
    assert 0 < hw.hbm_efficiency <= 1 and 0 <= hw.moe_expert_us < 1
    assert hw.fp4_flops >= hw.fp8_flops >= hw.bf16_flops > hw.fp32_flops or hw.fp4_runs_as != "fp4"
    assert max(hw.beta_one_shot, hw.beta_two_shot, hw.beta_ring) <= hw.nvlink_bandwidth


def test_hopper_has_no_fp4_and_prices_it_at_bf16() -> None:
    for name in ("h100", "h200"):
        hw = load_hardware(name)
        assert hw.fp4_runs_as == "bf16" and hw.peak_flops("fp4") == hw.peak_flops("bf16")
    assert load_hardware("gb300").peak_flops("fp4") == 15e15


def test_h200_uses_the_measured_read_chain() -> None:
    hw = load_hardware("H200")  # names are case-insensitive
    assert hw.launch_gap_us + hw.kernel_fixed_us == pytest.approx(2.06)  # t0 without PDL
    assert hw.launch_gap_pdl_us + hw.kernel_fixed_us == pytest.approx(0.44)  # t0 with PDL
    assert hw.hbm_efficiency * hw.hbm_bandwidth < 4.56e12  # decode GEMMs stream slower than a pure read


def test_a_user_adds_a_gpu_by_writing_one_file(tmp_path: Path) -> None:
    path = tmp_path / "my_gpu.toml"
    path.write_text(H200_TEXT.replace('name = "H200"', 'name = "MyGPU"'), encoding="utf-8")
    hw = load_hardware(path)
    assert hw.name == "MyGPU" and hw == load_hardware(str(path))
    assert hw.hbm_bandwidth == load_hardware("h200").hbm_bandwidth


def test_unknown_name_lists_the_choices() -> None:
    with pytest.raises(UserError, match="Unknown hardware 'tpu9'.*gb300"):
        load_hardware("tpu9")


def _drop_line(text: str, prefix: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith(prefix))


BAD_FILES = {
    "missing": (_drop_line(H200_TEXT, "hbm_bandwidth ="), "hbm_bandwidth"),
    "wrong-type": (H200_TEXT.replace("value = 4.8e12", 'value = "fast"'), "hbm_bandwidth"),
    "wrong-unit": (H200_TEXT.replace('value = 4.8e12, unit = "B/s"', 'value = 4.8e12, unit = "GB/s"'),
                   "hbm_bandwidth"),
    "no-source": (re.sub(r'(sm_count = \{[^}]*source = )"[^"]*"', r'\1" "', H200_TEXT), "sm_count"),
    "unknown-field": (H200_TEXT.replace('unit = "count", source', 'unit = "count", note = "", source'),
                      "sm_count"),
    "float-count": (H200_TEXT.replace("value = 132,", "value = 132.5,"), "sm_count"),
    "out-of-range": (H200_TEXT.replace("value = 1.62", "value = 5.0"), "launch_gap_us"),
    "no-range": (H200_TEXT.replace("range = [5.0, 7.0]\n", ""), "alpha_one_shot_us"),
    "typo-key": (H200_TEXT + '\n[hbm_bandwith]\nvalue = 1.0\n', "hbm_bandwith"),
    "fp4-fallback": (H200_TEXT.replace('runs_as = "bf16"', 'runs_as = "int8"'), "fp4_flops"),
    "efficiency-above-one": (H200_TEXT.replace("value = 0.79", "value = 1.5").replace(
        "range = [0.75, 0.955]", "range = [0.75, 2.0]"), "hbm_efficiency"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_profile_is_one_sentence_naming_file_and_key(case: str, tmp_path: Path) -> None:
    text, key = BAD_FILES[case]
    path = tmp_path / f"bad_{case}.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as info:
        load_hardware(path)
    message = str(info.value)
    assert path.name in message and key in message
    assert message.endswith(".") and "\n" not in message


def test_a_file_that_is_not_toml_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("this is = = not toml\n", encoding="utf-8")
    with pytest.raises(UserError, match="broken.toml is not valid TOML"):
        load_hardware(path)


def test_a_missing_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        load_hardware(tmp_path / "nope.toml")
