"""placer.documents: one reader for every JSON document, its refusals one line each, and
the models it checks (each publishes a valid JSON Schema; the shipped files and what
placer writes meet them)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import pytest

from placer.documents import (MAX_DOCUMENT_BYTES, POSITIVE, TEXT, VERSION_1, NonFinite, NonNegativeInt, Open,
                              check_model, field_path, parse_document, read_document, read_model)
from placer.errors import InputError, PlacerError, ProfileError
from pydantic import Field, TypeAdapter, ValidationError


class Doc(Open):
    DESCRIPTION = "an object"
    n: POSITIVE
    items: Annotated[list[tuple[NonNegativeInt, TEXT]], Field(description="a list of [count, name] pairs")]
    free: dict[str, Any] = {}


class Anything(Open):
    pass


def _refusal(tmp_path, text: bytes | str, model=Doc, **kw) -> str:
    path = tmp_path / "doc.json"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    with pytest.raises(InputError) as e:
        read_model(path, model, "test document", InputError, **kw)
    message = str(e.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message


def test_a_valid_document_reads_back_as_its_model(tmp_path):
    (tmp_path / "ok.json").write_text('{"n": 2.5, "items": [[3, "a"]], "free": {"x": [1, {"y": null}]}}')
    doc = read_model(tmp_path / "ok.json", Doc, "test document")
    assert (doc.n, doc.items, doc.free) == (2.5, [(3, "a")], {"x": [1, {"y": None}]})
    assert read_document(tmp_path / "ok.json", "test document") == {
        "n": 2.5, "items": [[3, "a"]], "free": {"x": [1, {"y": None}]}}


@pytest.mark.parametrize("text, words", [
    ('{"n": NaN, "items": []}', "field 'n': expected a positive finite number, found NaN"),
    ('{"n": -Infinity, "items": []}', "field 'n': expected a positive finite number, found -Infinity"),
    ('{"n": 1e400, "items": []}', "field 'n': expected a positive finite number, found 1e400"),
    ('{"n": %s, "items": []}' % (10 ** 400), "field 'n': expected a positive finite number, found an integer of "
                                            "about 401 digits"),
    ('{"n": 0, "items": []}', "field 'n': expected a positive finite number, found 0"),
    ('{"n": 1, "items": [[1, "a"], [2.0, "b"]]}', "field 'items[1][0]': expected a list of [count, name] pairs, "
                                                  "found 2.0"),
    ('{"n": "3", "items": []}', "field 'n': expected a positive finite number, found '3'"),
    ('{"n": 1, "items": [[1, "a", 2]]}', "field 'items[0]': expected a list of [count, name] pairs, found a JSON list"),
    ('{"n": 1, "items": [[true, "a"]]}', "field 'items[0][0]'"),
    ('{"n": 1, "items": [[%d, "a"]]}' % 2 ** 63, "field 'items[0][0]'"),   # past int64
    ('{"n": 1}', "field 'items': missing"),
    ('[]', "expected an object, found an empty list"),
    ('{"n": 1, "items": [], "free": {"deep": [0, {"z": NaN}]}}',
     "field 'free.deep[1].z': expected a finite number, found NaN"),
])
def test_fields_are_named_with_their_json_path(tmp_path, text, words):
    assert words in _refusal(tmp_path, text)


@pytest.mark.parametrize("text, words", [
    (b"", "not a JSON test document: the file is empty"),
    (b"\n \t", "not a JSON test document: the file is empty"),
    (b'{"n": "\xff"}', "not a JSON test document: the file is not UTF-8 text (byte 7)"),
    (b"[" * 100000 + b"]" * 100000, "not a JSON test document: nested too deeply to read"),
    (b'{"n": ' + b"9" * 5000 + b"}", "not a JSON test document: a number of more digits than Python reads"),
    (b'{"n": 1', "not a JSON test document: Expecting ',' delimiter: line 1 column 8 (char 7)"),
    (b'{"n": 1} {"n": 2}', "not a JSON test document: Extra data"),
])
def test_unreadable_text_is_one_line(tmp_path, text, words):
    assert words in _refusal(tmp_path, text)


def test_a_folder_or_a_missing_file_is_refused(tmp_path):
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(ProfileError, match="dir.json: cannot read the machine profile: it is a folder"):
        read_document(tmp_path / "dir.json", "machine profile", ProfileError)
    with pytest.raises(PlacerError, match="absent.json: cannot read the plan: No such file"):
        read_model(tmp_path / "absent.json", Anything, "plan")


def test_a_file_past_the_size_cap_is_refused_before_it_is_read(tmp_path):
    """A sparse file of 1 TiB: refused from its size alone (reading it would take hours)."""
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(1 << 40)
    with pytest.raises(InputError) as e:
        read_document(path, "plan", InputError)
    message = str(e.value)
    assert "the plan is 1,048,576 MiB, more than the 256 MiB placer reads" in message
    assert MAX_DOCUMENT_BYTES == 256 * 2 ** 20
    small = tmp_path / "small.json"
    small.write_text('{"n": 1, "items": []}')
    with pytest.raises(InputError, match="more than the 0 MiB"):
        read_model(small, Doc, "plan", InputError, max_bytes=10)


def test_non_finite_numbers_stay_visible_to_the_model():
    data = parse_document(b'[NaN, Infinity, 1e400, 1.5, 7]', "x", "test")
    assert [type(v) for v in data] == [NonFinite, NonFinite, NonFinite, float, int]
    assert [repr(v) for v in data[:3]] == ["NaN", "Infinity", "1e400"]
    check_model({"x": [1, 2]}, Anything, "here")
    with pytest.raises(PlacerError, match="here: field 'x\\[1\\]': expected a finite number, found NaN"):
        check_model({"x": [1, data[0]]}, Anything, "here")


def test_field_paths_read_as_json_paths():
    assert field_path(["devices", 2, "peak_flops"]) == "devices[2].peak_flops"
    assert field_path([0, "a", 1, 2]) == "[0].a[1][2]"
    assert field_path([]) == ""


def _models():
    from placer.documents.collectives import Measurements
    from placer.documents.manifest import Manifest
    from placer.documents.plan import PlanDocument
    from placer.documents.profiles import ClusterDocument, DeviceProfileDocument, MachineDocument
    from placer.documents.run_record import RunRecordDocument
    from placer.documents.value_info import ValueInfo
    return {"profile": DeviceProfileDocument, "machine": MachineDocument, "cluster": ClusterDocument,
            "manifest": Manifest, "plan": PlanDocument, "run record": RunRecordDocument,
            "value_info": ValueInfo, "collectives": Measurements}


@pytest.mark.parametrize("name", list(_models()))
def test_every_model_publishes_a_json_schema(name):
    """``Model.model_json_schema()``: a JSON document, describing an object, with a title
    and what each object must be."""
    schema = _models()[name].model_json_schema()
    assert json.loads(json.dumps(schema, allow_nan=False)) == schema
    assert schema["type"] == "object" and schema["title"] and schema["description"]


def test_the_shipped_profiles_meet_their_models():
    from placer.hardware.profiles import shipped_profiles_dir
    models = _models()
    root = shipped_profiles_dir()
    checked = 0
    for folder, model in ((root, models["profile"]), (root / "machines", models["machine"]),
                          (root / "clusters", models["cluster"])):
        for path in sorted(folder.glob("*.json")):
            read_model(path, model, "profile")
            checked += 1
    assert checked == 21          # 13 device profiles, 5 machines, 3 clusters (profiles/README.md)


def test_a_written_run_record_and_plan_meet_their_models(tmp_path):
    from report_cases import four_gpu_plan, four_gpu_run
    models = _models()
    plan = four_gpu_plan()
    check_model(plan, models["plan"], "plan")
    check_model(four_gpu_run(plan), models["run record"], "run")


@pytest.mark.parametrize("kind", ["machine", "cluster", "profile"])
def test_a_misspelt_key_is_named_with_the_known_ones(tmp_path, kind):
    """A key placer does not read would silently change nothing (a misspelt ``peer_links``
    drops the NVLink topology): every profile a person writes names it instead."""
    from placer.hardware.cluster import load_cluster
    from placer.errors import ProfileError
    from placer.hardware.machine import load_machine
    from placer.hardware.profiles import load_profile
    root = Path(__file__).resolve().parents[1] / "profiles"
    source = {"machine": root / "machines" / "4x-v100-sxm2-nvlink.json",
              "cluster": next((root / "clusters").glob("*.json")), "profile": root / "v100-16gb-pcie3.json"}[kind]
    data = json.loads(source.read_text())
    if kind == "machine":
        data["peer_link"] = data.pop("peer_links")
        wrong = "peer_link"
    else:
        data["descripton"] = data.pop("description", "x")
        wrong = "descripton"
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps(data))
    load = {"machine": load_machine, "cluster": load_cluster, "profile": load_profile}[kind]
    with pytest.raises(ProfileError) as refused:
        load(path)
    message = str(refused.value)
    assert f"field '{wrong}': not a key placer knows here" in message and "known: " in message


def _reads_back_the_same(path: Path, model) -> None:
    """What a writer wrote validates against its model, and the model holds the same values."""
    doc = read_model(path, model, "document")
    assert doc.model_dump(mode="json", by_alias=True, exclude_unset=True) == json.loads(path.read_text())


def test_what_placer_writes_reads_back_through_its_model(tmp_path, capsys):
    """Round trips: each writer's output -> read_model -> the same values."""
    from placer.cli import main
    from placer.formats import save_value_info
    from placer.hardware.device_profile import save_profile
    from placer.documents.profiles import PEER_KINDS
    from placer.hardware.machine import LINK_KINDS
    from placer.hardware.profiles import find_profile, load_profile
    from placer.profiling.collective_bench import CollectiveMeasurements, CollectivePoint, save_measurements
    from placer.profiling.link import machine_profile
    from placer.runtime import record
    from placer.types import TensorType
    from report_cases import four_gpu_plan, four_gpu_run
    models = _models()
    for name in ("v100-16gb-pcie3", "host-ci-2core"):
        save_profile(load_profile(find_profile(name)), tmp_path / f"{name}.json")
        _reads_back_the_same(tmp_path / f"{name}.json", models["profile"])
    curves = [{"src": 0, "dst": 1, "p2p": True, "latency_s": 1e-5, "bytes_per_s": 4e10, "points": [[4096, 1.1e-5]]},
              {"src": 1, "dst": 0, "p2p": False, "latency_s": 2e-5, "bytes_per_s": 9e9, "points": []}]
    (tmp_path / "m.json").write_text(json.dumps(machine_profile("m", "host-ci-2core", "t4-pcie3", curves, 2, "h")))
    _reads_back_the_same(tmp_path / "m.json", models["machine"])
    assert PEER_KINDS == ("staged", "pcie-p2p", *LINK_KINDS)
    run = record.from_dict(four_gpu_run(four_gpu_plan()))
    record.save(run, tmp_path / "run.json")
    _reads_back_the_same(tmp_path / "run.json", models["run record"])
    assert record.load(tmp_path / "run.json") == run
    points = [CollectivePoint("allreduce", 4096, 1e-5, 4e8, 4e8), CollectivePoint("allgather", 0, 2e-6, 0.0, 0.0)]
    save_measurements(CollectiveMeasurements([0, 1], ["T4", "T4"], 2708, points, {"allreduce": {"latency_s": 1e-5}},
                                             [{"kind": "allreduce", "ratio": 1.1}], "h", "2026-01-01"),
                      str(tmp_path / "c.json"))
    _reads_back_the_same(tmp_path / "c.json", models["collectives"])
    save_value_info({"data": TensorType((4, 3, 8, 8), "float32"), "ids": TensorType((4,), "int64")},
                    tmp_path / "value_info.json")
    _reads_back_the_same(tmp_path / "value_info.json", models["value_info"])
    net = Path(__file__).resolve().parents[1] / "placer" / "examples" / "data" / "dlrm_small.pbtxt"
    assert main(["plan", str(net), "--gpus", "2", "--json"]) == 0
    (tmp_path / "plan.json").write_text(capsys.readouterr().out)
    _reads_back_the_same(tmp_path / "plan.json", models["plan"])
    assert main(["plan", str(net), "--cluster", "local-2hosts", "-o", str(tmp_path / "cluster")]) == 0
    _reads_back_the_same(tmp_path / "cluster" / "manifest.json", models["manifest"])
    _reads_back_the_same(tmp_path / "cluster" / "plan.json", models["plan"])


@pytest.mark.parametrize("change, words", [
    (lambda d: d.update(schema_version=True), "field 'schema_version': expected version 1 (the version this placer "
                                              "reads), found true"),
    (lambda d: d["devices"][0].update(link=None), "field 'devices[0].link': expected a device object, found null"),
    (lambda d: d["devices"][0]["peak_flops"].pop("float32"), "field 'devices[0].peak_flops.float32': missing"),
    (lambda d: d["devices"][0]["source"].update(kind=None), "field 'devices[0].source.kind': expected 'measured' or "
                                                            "'datasheet', found null"),
    (lambda d: d["devices"][0]["source"].pop("kind"), "field 'devices[0].source.kind': missing"),
    (lambda d: d["devices"][0].update(memory_capacity_bytes="3"), "field 'devices[0].memory_capacity_bytes': "
                                                                  "expected bytes (1e+06 to 1e+16), found '3'"),
])
def test_a_profile_is_refused_as_its_schema_said(tmp_path, change, words):
    """What the JSON Schemas refused, the models refuse, in the same words: a version of
    ``true``, null for a key that may be left out, a missing float32 peak, a source's kind."""
    from placer.hardware.profiles import load_profile
    data = json.loads((Path(__file__).resolve().parents[1] / "profiles" / "host-ci-2core.json").read_text())
    change(data)
    (tmp_path / "p.json").write_text(json.dumps(data))
    with pytest.raises(ProfileError) as refused:
        load_profile(tmp_path / "p.json")
    assert words in str(refused.value)


def test_a_version_is_compared_by_value():
    """``"schema_version": 1.0`` is version 1, as the JSON Schema ``const`` the readers used
    before the models said (and a hand-edited file may hold); ``true`` and 1.5 are not."""
    version = TypeAdapter(VERSION_1)
    assert version.validate_python(1.0) == 1 and type(version.validate_python(1.0)) is int
    for wrong in (True, 1.5, "1", 2):
        with pytest.raises(ValidationError):
            version.validate_python(wrong)
