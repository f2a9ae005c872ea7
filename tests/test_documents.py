"""placer.documents: one reader for every JSON document, its refusals one line each, and
the schemas it checks (each a valid JSON Schema that the shipped files meet)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from placer.documents import (MAX_DOCUMENT_BYTES, NonFinite, check_document, field_path, number, parse_document,
                              read_document)
from placer.errors import InputError, PlacerError, ProfileError

SCHEMA = {"type": "object", "description": "an object", "required": ["n", "items"], "properties": {
    "n": number("a positive finite number", positive=True),
    "items": {"type": "array", "description": "a list of [count, name] pairs", "items": {
        "type": "array", "prefixItems": [{"type": "integer", "minimum": 0}, {"type": "string"}]}},
    "free": {"type": "object"}}}


def _refusal(tmp_path, text: bytes | str, schema=SCHEMA, **kw) -> str:
    path = tmp_path / "doc.json"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    with pytest.raises(InputError) as e:
        read_document(path, schema, "test document", InputError, **kw)
    message = str(e.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message


def test_a_valid_document_reads_back_as_plain_json(tmp_path):
    (tmp_path / "ok.json").write_text('{"n": 2.5, "items": [[3, "a"]], "free": {"x": [1, {"y": null}]}}')
    assert read_document(tmp_path / "ok.json", SCHEMA, "test document") == {
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
        read_document(tmp_path / "dir.json", None, "machine profile", ProfileError)
    with pytest.raises(PlacerError, match="absent.json: cannot read the plan: No such file"):
        read_document(tmp_path / "absent.json", None, "plan")


def test_a_file_past_the_size_cap_is_refused_before_it_is_read(tmp_path):
    """A sparse file of 1 TiB: refused from its size alone (reading it would take hours)."""
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(1 << 40)
    with pytest.raises(InputError) as e:
        read_document(path, None, "plan", InputError)
    message = str(e.value)
    assert "the plan is 1,048,576 MiB, more than the 256 MiB placer reads" in message
    assert MAX_DOCUMENT_BYTES == 256 * 2 ** 20
    small = tmp_path / "small.json"
    small.write_text('{"n": 1, "items": []}')
    with pytest.raises(InputError, match="more than the 0 MiB"):
        read_document(small, None, "plan", InputError, max_bytes=10)


def test_non_finite_numbers_stay_visible_to_the_schema():
    data = parse_document(b'[NaN, Infinity, 1e400, 1.5, 7]', "x", "test")
    assert [type(v) for v in data] == [NonFinite, NonFinite, NonFinite, float, int]
    assert [repr(v) for v in data[:3]] == ["NaN", "Infinity", "1e400"]
    check_document({"x": [1, 2]}, {"type": "object"}, "here")
    with pytest.raises(PlacerError, match="here: field 'x\\[1\\]': expected a finite number, found NaN"):
        check_document({"x": [1, data[0]]}, {"type": "object"}, "here")


def test_field_paths_read_as_json_paths():
    assert field_path(["devices", 2, "peak_flops"]) == "devices[2].peak_flops"
    assert field_path([0, "a", 1, 2]) == "[0].a[1][2]"
    assert field_path([]) == ""


def _schemas():
    from placer.hardware.cluster import CLUSTER_SCHEMA
    from placer.formats import VALUE_INFO_SCHEMA
    from placer.hardware.machine import MACHINE_SCHEMA
    from placer.rewrite.manifest import MANIFEST_SCHEMA
    from placer.profiling.collective_bench import MEASUREMENTS_SCHEMA
    from placer.hardware.device_profile import PROFILE_SCHEMA
    from placer.report.doc import PLAN_SCHEMA
    from placer.runtime.record import RUN_RECORD_SCHEMA
    return {"profile": PROFILE_SCHEMA, "machine": MACHINE_SCHEMA, "cluster": CLUSTER_SCHEMA,
            "manifest": MANIFEST_SCHEMA, "plan": PLAN_SCHEMA, "run record": RUN_RECORD_SCHEMA,
            "value_info": VALUE_INFO_SCHEMA, "collectives": MEASUREMENTS_SCHEMA}


@pytest.mark.parametrize("name", list(_schemas()))
def test_every_schema_is_a_json_schema_one_can_publish(name):
    from jsonschema import Draft202012Validator
    schema = _schemas()[name]
    Draft202012Validator.check_schema(schema)
    assert json.loads(json.dumps(schema, allow_nan=False)) == schema


def test_the_shipped_profiles_meet_their_schemas():
    from placer.hardware.profiles import shipped_profiles_dir
    schemas = _schemas()
    root = shipped_profiles_dir()
    checked = 0
    for folder, schema in ((root, schemas["profile"]), (root / "machines", schemas["machine"]),
                           (root / "clusters", schemas["cluster"])):
        for path in sorted(folder.glob("*.json")):
            read_document(path, schema, "profile")
            checked += 1
    assert checked == 18          # 10 device profiles, 5 machines, 3 clusters (profiles/README.md)


def test_a_written_run_record_and_plan_meet_their_schemas(tmp_path):
    from report_cases import four_gpu_plan, four_gpu_run
    schemas = _schemas()
    plan = four_gpu_plan()
    check_document(plan, schemas["plan"], "plan")
    check_document(four_gpu_run(plan), schemas["run record"], "run")


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
