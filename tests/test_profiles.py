"""Profile planning and selection (docs/DESIGN.md "Engines and profiles"): pure arithmetic on the graph specs, no TensorRT, no GPU."""

from __future__ import annotations

import pytest

from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.graphs import graph_specs
from seer_trt.contracts.profiles import (
    LengthBuckets,
    Profile,
    Range,
    max_sizes,
    parse_overrides,
    plan_profiles,
    select_profile,
    tiles_per_image,
)

DIMS = {"hidden": 128, "vocab": 103, "layers": 8, "kv_heads": 4, "head_dim": 32, "image_size": 32, "tile_tokens": 16}
BUCKETS = LengthBuckets(batch=(1, 2, 4, 8, 16), prompt=(64, 128, 256, 512), answer=(16, 32, 64, 128, 256))


def inputs(names=None):
    specs = graph_specs(DIMS, "float16", names) if names else graph_specs(DIMS, "float16")
    return {g: [(t.name, t.shape) for t in spec.inputs] for g, spec in specs.items()}


def test_one_profile_per_answer_bucket_covering_the_gap_below_it():
    plan = plan_profiles(inputs(), BUCKETS)
    zero = plan.profiles("step_zero")
    assert [p.range("answer") for p in zero] == [
        Range(1, 16, 16), Range(17, 32, 32), Range(33, 64, 64), Range(65, 128, 128), Range(129, 256, 256)
    ]  # fmt: skip
    for p in zero:  # batch and prompt span all their buckets, opt at the middle one
        assert p.range("batch") == Range(1, 4, 16)
        assert p.range("prompt") == Range(1, 128, 512)
        assert p.axes == ("batch", "prompt", "answer")
    denoise = plan.profiles("denoise")  # the cached window graph: each answer range computing the prompt, then cached
    assert len(denoise) == 2 * len(zero)
    for computing, cached, plain in zip(denoise[:5], denoise[5:], zero, strict=True):
        assert computing.axes == cached.axes == ("batch", "prompt", "answer", "past", "history")
        assert computing.range("answer") == cached.range("answer") == plain.range("answer")
        assert (computing.range("prompt"), computing.range("past"), computing.range("history")) == (
            Range(1, 128, 512), Range(0, 0, 0), Range(1, 1, 1))  # fmt: skip
        assert (cached.range("prompt"), cached.range("past"), cached.range("history")) == (
            Range(0, 0, 0), Range(1, 128, 512), Range(1, 1, 3))  # fmt: skip
        assert computing.range("seq") == plain.range("seq") == cached.range("seq")
    (embed,) = plan.profiles("embed")
    assert embed.to_dict() == {"batch": [1, 4, 16], "tokens": [1, 128, 512]}
    (vision,) = plan.profiles("vision")
    assert vision.to_dict() == {"tiles": [1, 1, 16]}  # one tile each of up to a batch of images


def test_input_shapes_keep_seq_equal_to_past_plus_prompt_plus_answer():
    plan = plan_profiles(inputs(("denoise",)), BUCKETS)
    spec = graph_specs(DIMS, "float16", ("denoise",))["denoise"]
    names = [(t.name, t.shape) for t in spec.inputs]
    shapes = plan.profiles("denoise")[1].shapes(names)
    assert shapes["prefix_embeds"] == ((1, 1, 128), (4, 128, 128), (16, 512, 128))  # fixed hidden size
    assert shapes["gen_ids"] == ((1, 17), (4, 32), (16, 32))
    for name in ("segment_ids", "position_ids"):  # TensorRT checks seq == past + prompt + answer at min, opt, max
        assert shapes[name] == ((1, 18), (4, 160), (16, 544))
    assert shapes["past_key_values.7.value"] == ((1, 1, 4, 0, 32), (1, 4, 4, 0, 32), (1, 16, 4, 0, 32))  # no cache
    assert shapes["past_weights"] == ((1,), (1,), (1,))
    cached = plan.profiles("denoise")[6].shapes(names)  # a cached step: no prompt, up to 3 snapshots of the past
    assert cached["prefix_embeds"] == ((1, 0, 128), (4, 0, 128), (16, 0, 128))
    assert cached["past_key_values.0.key"] == ((1, 1, 4, 1, 32), (1, 4, 4, 128, 32), (3, 16, 4, 512, 32))
    assert cached["segment_ids"] == ((1, 18), (4, 160), (16, 544))


def test_split_on_two_axes_is_their_cross_product():
    plan = plan_profiles(inputs(("denoise", "embed")), BUCKETS, split=("answer", "batch"))
    denoise = plan.profiles("denoise")
    assert len(denoise) == 2 * 5 * 5  # computing the prompt, and cached
    assert len({(p.range("batch"), p.range("answer"), p.range("past")) for p in denoise}) == 50
    assert len(plan.profiles("embed")) == 5  # split on batch; tokens stay one range


def test_anyres_tiles_plan_the_base_tile_and_the_largest_grid():
    assert tiles_per_image("pad", 32, [(64, 64)]) == 1
    assert tiles_per_image("anyres_max_9", 32, [(32, 64), (64, 64), (96, 32)]) == 1 + 4
    plan = plan_profiles(inputs(("vision",)), BUCKETS, max_tiles=5)
    assert plan.profiles("vision")[0].range("tiles") == Range(1, 5, 16)
    assert plan_profiles(inputs(("vision",)), BUCKETS, max_tiles=37).profiles("vision")[0].range("tiles").max == 37


@pytest.mark.parametrize(
    "sizes, expected",
    [
        ({"batch": 1, "prompt": 30, "answer": 16}, 0),
        ({"batch": 3, "prompt": 30, "answer": 17}, 1),
        ({"batch": 16, "prompt": 512, "answer": 64}, 2),
        ({"batch": 1, "prompt": 1, "answer": 256, "seq": 257}, 4),
        ({"batch": 1, "prompt": 30, "past": 0, "history": 1, "answer": 16}, 0),  # a step computing the prompt
        ({"batch": 2, "prompt": 0, "past": 30, "history": 2, "answer": 20}, 6),  # a cached step
    ],
)
def test_selection_picks_the_profile_covering_the_call(sizes, expected):
    profiles = plan_profiles(inputs(("denoise",)), BUCKETS).profiles("denoise")
    assert select_profile(profiles, sizes, "denoise") == expected


@pytest.mark.parametrize(
    "sizes, named",
    [({"batch": 1, "prompt": 30, "answer": 257}, "answer"), ({"batch": 17, "prompt": 30, "answer": 8}, "batch")],
)
def test_no_covering_profile_is_one_error_naming_the_limits_and_the_fix(sizes, named):
    profiles = plan_profiles(inputs(("denoise",)), BUCKETS).profiles("denoise")
    with pytest.raises(ConfigError) as err:
        select_profile(profiles, sizes, "denoise")
    message = str(err.value)
    assert f"'{named}': {sizes[named]}" in message and "'seq': 768" in message and "seer-build --profiles" in message


def test_a_cached_step_needs_the_cached_profiles():
    plain = plan_profiles(inputs(("denoise",)), BUCKETS).profiles("denoise")[:5]  # only the profiles computing prompts
    with pytest.raises(ConfigError, match="'past': 30"):
        select_profile(plain, {"batch": 1, "prompt": 0, "past": 30, "history": 1, "answer": 16}, "denoise")


def test_overlapping_profiles_choose_the_nearest_opt_and_the_first_on_a_tie():
    wide = Profile((("answer", Range(1, 64, 64)),))
    short = Profile((("answer", Range(1, 16, 64)),))
    profiles = [wide, short]
    assert select_profile(profiles, {"answer": 16}) == 1
    assert select_profile(profiles, {"answer": 60}) == 0
    assert select_profile(profiles, {"answer": 32}) == 0  # |log2(32/64)| == |log2(32/16)|: the first


def test_max_sizes_include_seq():
    profiles = plan_profiles(inputs(("denoise",)), BUCKETS).profiles("denoise")
    assert max_sizes(profiles) == {"batch": 16, "prompt": 512, "answer": 256, "past": 512, "history": 3, "seq": 768}


def test_overrides_replace_buckets_and_choose_split_axes():
    buckets, split = parse_overrides(["answer=16,64", "batch=1,8", "split=answer,prompt"], BUCKETS)
    assert buckets == LengthBuckets(batch=(1, 8), prompt=BUCKETS.prompt, answer=(16, 64))
    assert split == ("answer", "prompt")
    assert parse_overrides([], BUCKETS) == (BUCKETS, ("answer",))


@pytest.mark.parametrize(
    "item, match",
    [
        ("answer=64,16", "increasing"),
        ("answer", "AXIS=SIZES"),
        ("answer=16,x", "integers"),
        ("hidden=128", "unknown key"),
        ("split=tiles", "cannot be split"),
    ],
)
def test_bad_overrides_are_config_errors(item, match):
    with pytest.raises(ConfigError, match=match):
        parse_overrides([item], BUCKETS)


def test_profiles_round_trip_and_reject_inverted_ranges():
    profile = plan_profiles(inputs(("denoise",)), BUCKETS).profiles("denoise")[2]
    assert Profile.from_dict(profile.to_dict()) == profile
    with pytest.raises(ConfigError, match="min <= opt <= max"):
        Profile.from_dict({"answer": [33, 16, 64]})
    with pytest.raises(ConfigError, match="min <= opt <= max"):
        Profile.from_dict({"past": [-1, 0, 0]})
    with pytest.raises(ConfigError, match="not planned axes"):
        Profile.from_dict({"hidden": [1, 1, 1]})
    with pytest.raises(ConfigError, match="malformed"):
        Profile.from_dict({"answer": [1, 2]})


def test_plan_describes_every_profile():
    text = plan_profiles(inputs(("denoise", "embed")), BUCKETS).describe()
    assert "denoise: 10 profile(s)" in text
    assert "[4] batch 1..16 (opt 4), prompt 1..512 (opt 128), answer 129..256 (opt 256), past 0..0 (opt 0)" in text
    assert "[9] batch 1..16 (opt 4), prompt 0..0 (opt 0), answer 129..256 (opt 256), past 1..512 (opt 128)" in text
    assert "embed: 1 profile(s)" in text


def test_a_shifted_exports_cached_step_has_a_profile():
    """Dream's cached step computes each row's last prompt position (one column padded, one per row packed) and
    caches the rest: its profile takes a prompt of 1 .. the largest bucket beside the past, not 0."""
    plan = plan_profiles(inputs(("denoise",)), BUCKETS, logit_shift=1)
    profiles = plan.profiles("denoise")
    for prompt, past in ((1, 39), (3, 37), (1, 511), (8, 0)):
        i = select_profile(profiles, {"batch": 1, "prompt": prompt, "answer": 16, "past": past, "history": 1})
        assert profiles[i].range("past").max >= past and profiles[i].range("prompt").min <= prompt
    with pytest.raises(ConfigError, match="no engine profile"):  # an unshifted plan has none for that call
        select_profile(plan_profiles(inputs(("denoise",)), BUCKETS).profiles("denoise"),
                       {"batch": 1, "prompt": 1, "answer": 16, "past": 39, "history": 1})  # fmt: skip
