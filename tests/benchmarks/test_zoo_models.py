"""benchmarks/zoo_models.py: the zoo covers what issues #29 and #30 ask for; with torch installed,
zoo models export to ONNX and run on polykit's cpu target close to torch fp32."""

from __future__ import annotations

import pytest

from benchmarks.torch_export import first_tensor
from benchmarks.zoo_models import BY_NAME, CONV, MODELS, REQUIRED, TRANSFORMER, VIDEO

#: the models the issues name (a zoo entry each)
NAMED = ("resnet18", "resnet50", "resnext50_32x4d", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0",
         "efficientnet_v2_s", "regnet_y_800mf", "shufflenet_v2_x1_0", "densenet121", "convnext_tiny", "mnasnet1_0",
         "squeezenet1_1", "googlenet", "vgg11_bn", "bert_base", "gpt2", "vit_b_16", "swin_t", "whisper_encoder",
         "t5_encoder", "deit_small", "dinov2_small", "llama_small", "distilbert", "wav2vec2_base")


def test_at_least_16_convolutional_and_8_transformer_models():
    assert sum(m.family == CONV for m in MODELS) >= 16
    assert sum(m.family == TRANSFORMER for m in MODELS) >= 8


@pytest.mark.parametrize("family,trait", [(f, t) for f, traits in REQUIRED.items() for t in traits])
def test_every_required_trait_has_a_model_of_its_family(family, trait):
    assert any(m.family == family and trait in m.covers for m in MODELS)


def test_the_models_the_issues_name_are_in_the_zoo():
    assert not [n for n in NAMED if n not in BY_NAME]


def test_names_are_unique_and_families_known():
    assert len(BY_NAME) == len(MODELS)
    assert {m.family for m in MODELS} == {CONV, TRANSFORMER, VIDEO}


def test_every_model_runs_batch_1_and_a_larger_throughput_batch():
    for m in MODELS:
        assert m.batches[0] == 1 and max(m.batches) > 1, m.name
        assert max(m.batches) == (32 if m.family == CONV and "segmentation" not in m.covers else 8), m.name


def test_every_input_is_named_once_and_ids_have_a_vocabulary():
    for m in MODELS:
        names = [s.name for s in m.inputs]
        assert len(set(names)) == len(names) and names, m.name
        assert all(s.high > 0 for s in m.inputs if s.kind == "ids"), m.name
        assert {s.kind for s in m.inputs} <= {"normal", "ids", "ones"}, m.name


def test_every_token_model_feeds_an_all_ones_attention_mask():
    # causal decoders too: transformers 5 without a mask computes torch.diff, which does not export
    for m in MODELS:
        kinds = {s.name: s.kind for s in m.inputs}
        if "input_ids" in kinds:
            assert kinds.get("attention_mask") == "ones", m.name


def test_first_tensor_picks_out_then_the_first_value():
    out, aux, hidden, pooled = object(), object(), object(), object()
    assert first_tensor({"aux": aux, "out": out}) is out  # torchvision segmentation
    assert first_tensor({"last_hidden_state": hidden, "pooler_output": pooled}) is hidden  # a ModelOutput
    assert first_tensor((hidden, pooled)) is hidden
    assert first_tensor(out) is out


# ---- with torch: real exports on the cpu target --------------------------------------------------

@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def test_prepare_redraws_zero_weights_and_fits_batchnorm_statistics(torch):
    from benchmarks.zoo_models import InputSpec, ZooModel, prepare

    def make():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), torch.nn.Linear(1, 1, bias=False))

    model = ZooModel("tiny", CONV, (), (InputSpec("input", (3, 8, 1)),), (1, 2), make)
    torch.manual_seed(0)
    module = make()
    torch.nn.init.zeros_(module[2].weight)
    prepare(model, module, torch)
    assert not module.training and module[2].weight.any()
    x = torch.randn(64, 3, 8, 1, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        normalized = module[1](module[0](x))
    assert abs(float(normalized.std()) - 1) < 0.2  # running statistics of the conv's output, not 0 / 1


@pytest.mark.parametrize("name", ["squeezenet1_1", "shufflenet_v2_x1_0"])
def test_zoo_model_exports_and_runs_on_the_cpu_target_close_to_torch(name, torch, tmp_path):
    pytest.importorskip("torchvision")
    from benchmarks.zoo import exported
    from polykit.compiler.builder.builder import build_plan
    from polykit.compiler.builder.config import BuilderConfig
    from polykit.runtime.engine import Engine

    module, inputs, path, facts = exported(BY_NAME[name], 1, tmp_path, torch)
    assert path.is_file() and facts["export_cached"] is False and facts["export_s"] >= 0
    plan = build_plan(str(path), BuilderConfig(target="cpu", builder_optimization_level=0))
    with Engine(plan) as engine, engine.create_execution_context() as ctx:
        out = ctx.execute({k: v.numpy() for k, v in inputs.items()})[plan.outputs[0]]
    with torch.no_grad():
        ref = module(*inputs.values())
    assert float((torch.from_numpy(out) - ref).abs().max() / ref.abs().max()) < 1e-4
    again = exported(BY_NAME[name], 1, tmp_path, torch)
    assert again[3]["export_cached"] is True and again[3]["export_s"] == facts["export_s"]
