"""Loading data files: malformed records and price files fail with the file, line and field."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest

from whichgpu.catalog import load_catalog
from whichgpu.catalog.loader import DATA_DIR, read_data_dir
from whichgpu.errors import CatalogError, PriceFileError
from whichgpu.schema import Confidence

SOURCES = """\
doc-a:
  title: A datasheet
  url: https://example.com/a.pdf
  publisher: Vendor
  kind: datasheet
doc-b:
  title: A database
  url: https://example.com/b
  publisher: Someone
  kind: secondary
"""

GPU = """\
gpus:
  - id: test-gpu
    name: Test GPU 1000
    vendor: nvidia
    segment: consumer
    source: doc-a
    compute_capability: 8.9
    launch_date: 2022-10-12
    memory_gb: 24
    memory_bandwidth_gbps: 1008
    l2_cache_mib: {value: 72, source: doc-b}
    fp64_tflops: {value: 1.29, confidence: derived, method: "FP32 / 64"}
    fp32_tflops: 82.6
    launch_price_usd: 1599
"""


def _data_dir(tmp_path: Path, gpu_yaml: str = GPU, prices: str | None = None) -> Path:
    root = tmp_path / "v1"
    for sub in ("sources", "gpus", "prices"):
        (root / sub).mkdir(parents=True)
    (root / "sources" / "s.yaml").write_text(SOURCES)
    (root / "gpus" / "g.yaml").write_text(gpu_yaml)
    if prices is not None:
        (root / "prices" / "p.csv").write_text(prices)
    return root


def test_values_carry_source_and_confidence(tmp_path: Path) -> None:
    data = read_data_dir(_data_dir(tmp_path))
    (gpu,) = data.gpus
    assert gpu.compute_capability == "8.9"  # YAML float coerced to text
    assert gpu.provenance["memory_gb"].source == "doc-a"
    assert gpu.provenance["memory_gb"].confidence is Confidence.DATASHEET
    assert gpu.provenance["l2_cache_mib"].confidence is Confidence.SECONDARY
    assert gpu.provenance["fp64_tflops"].method == "FP32 / 64"
    (launch,) = data.prices
    assert (launch.kind, launch.usd, launch.as_of) == ("launch", 1599, dt.date(2022, 10, 12))


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("memory_gb: 24", "memory_gb: lots"), "field 'memory_gb'"),
        (("memory_gb: 24", "memroy_gb: 24"), "unknown fields ['memroy_gb']"),
        (("source: doc-a", "source: doc-z"), "source 'doc-z' is not in the source table"),
        (('method: "FP32 / 64"', 'note: "x"'), "a derived value must say how"),
        (("vendor: nvidia", "vendor: nvdia"), "field 'vendor'"),
    ],
)
def test_bad_record_names_file_record_and_field(
    tmp_path: Path, edit: tuple[str, str], expected: str
) -> None:
    root = _data_dir(tmp_path, GPU.replace(*edit))
    with pytest.raises(CatalogError) as err:
        read_data_dir(root)
    message = str(err.value)
    assert "g.yaml" in message
    assert "gpu 'test-gpu'" in message
    assert expected in message


def test_duplicate_ids_are_rejected(tmp_path: Path) -> None:
    root = _data_dir(tmp_path)
    shutil.copy(root / "gpus" / "g.yaml", root / "gpus" / "h.yaml")
    with pytest.raises(CatalogError, match="also defined"):
        read_data_dir(root)


HEADER = "gpu_id,kind,usd,per,provider,region,as_of,source,note\n"


@pytest.mark.parametrize(
    ("row", "line", "field"),
    [
        ("nope,new,100,unit,,,2025-01-01,doc-a,\n", 2, "gpu_id"),
        ("test-gpu,new,cheap,unit,,,2025-01-01,doc-a,\n", 2, "usd"),
        ("test-gpu,new,inf,unit,,,2025-01-01,doc-a,\n", 2, "usd"),
        ("test-gpu,new,1e300,unit,,,2025-01-01,doc-a,\n", 2, "usd"),
        ("test-gpu,new,2e18,unit,,,2025-01-01,doc-a,\n", 2, "usd"),
        ("test-gpu,cloud-on-demand,1.5,unit,aws,us-east-1,2025-01-01,doc-a,\n", 2, "per"),
        ("test-gpu,new,100,unit,,,2025-13-01,doc-a,\n", 2, "as_of"),
        ("test-gpu,rent,100,unit,,,2025-01-01,doc-a,\n", 2, "kind"),
        ("test-gpu,cloud-spot,1.0,hour,,,2025-01-01,doc-a,\n", 2, "provider"),
        ("test-gpu,new,100,unit,,,2025-01-01,doc-z,\n", 2, "source"),
    ],
)
def test_bad_price_row_names_file_line_and_field(
    tmp_path: Path, row: str, line: int, field: str
) -> None:
    root = _data_dir(tmp_path, prices=HEADER + row)
    with pytest.raises(PriceFileError) as err:
        read_data_dir(root)
    assert (err.value.line, err.value.field) == (line, field)
    assert "p.csv" in str(err.value)


def test_cloud_rates_may_say_the_machine_sizes_they_come_in(tmp_path: Path) -> None:
    rows = (
        HEADER.strip()
        + ",instance_gpus\n"
        + "test-gpu,cloud-on-demand,2.0,hour,aws,,2025-01-01,doc-a,,8\n"
        + "test-gpu,cloud-on-demand,2.5,hour,lambda,,2025-01-01,doc-a,,1 2 4 8\n"
        + "test-gpu,cloud-on-demand,3.0,hour,vast,,2025-01-01,doc-a,,\n"
    )
    prices = read_data_dir(_data_dir(tmp_path, prices=rows)).prices
    sizes = {p.provider: p.instance_gpus for p in prices if p.kind == "cloud-on-demand"}
    assert sizes == {"aws": (8,), "lambda": (1, 2, 4, 8), "vast": None}
    aws, lam, vast = (next(p for p in prices if p.provider == n) for n in ("aws", "lambda", "vast"))
    assert not aws.offered_for(1) and aws.offered_for(8)
    assert lam.offered_for(2) and not lam.offered_for(3)
    assert vast.offered_for(1) and vast.offered_for(8)


@pytest.mark.parametrize(
    "row",
    [
        "test-gpu,cloud-on-demand,2.0,hour,aws,,2025-01-01,doc-a,,eight\n",
        "test-gpu,cloud-on-demand,2.0,hour,aws,,2025-01-01,doc-a,,0\n",
        "test-gpu,new,100,unit,,,2025-01-01,doc-a,,1\n",
    ],
)
def test_bad_machine_sizes_name_the_column(tmp_path: Path, row: str) -> None:
    root = _data_dir(tmp_path, prices=HEADER.strip() + ",instance_gpus\n" + row)
    with pytest.raises(PriceFileError) as err:
        read_data_dir(root)
    assert (err.value.line, err.value.field) == (2, "instance_gpus")


def test_price_comment_lines_keep_line_numbers(tmp_path: Path) -> None:
    root = _data_dir(
        tmp_path, prices="# a comment\n" + HEADER + "x,new,1,unit,,,2025-01-01,doc-a,\n"
    )
    with pytest.raises(PriceFileError) as err:
        read_data_dir(root)
    assert err.value.line == 3


def test_price_files_from_spreadsheets_read_or_say_how_to_save_them(tmp_path: Path) -> None:
    with_bom = HEADER.encode("utf-8-sig") + b"test-gpu,new,100,unit,,,2025-01-01,doc-a,\n"
    root = _data_dir(tmp_path, prices="")
    (root / "prices" / "p.csv").write_bytes(with_bom)
    assert 100 in [p.usd for p in read_data_dir(root).prices if p.kind == "new"]
    latin1 = HEADER.encode() + "test-gpu,new,100,unit,,,2025-01-01,doc-a,M\u00fcnchen\n".encode(
        "latin-1"
    )
    (root / "prices" / "p.csv").write_bytes(latin1)
    with pytest.raises(PriceFileError, match="is not UTF-8 text"):
        read_data_dir(root)


def test_price_header_must_match(tmp_path: Path) -> None:
    root = _data_dir(tmp_path, prices="gpu,price\n")
    with pytest.raises(PriceFileError, match="missing columns"):
        read_data_dir(root)


def test_shipped_data_loads() -> None:
    data = read_data_dir(DATA_DIR)
    assert data.gpus and data.sources


def _first_shipped_gpu() -> str:
    return read_data_dir(DATA_DIR).gpus[0].id


def test_user_prices_replace_and_add(tmp_path: Path) -> None:
    gpu_id = _first_shipped_gpu()
    user = tmp_path / "mine.csv"
    user.write_text(
        HEADER
        + f"{gpu_id},used,123.45,unit,ebay,US,2026-01-02,my own search,median of 5\n"
        + f"{gpu_id},cloud-on-demand,0.99,hour,mycloud,eu,2026-01-02,quote 17,\n"
    )
    catalog = load_catalog([user])
    used = catalog.prices(gpu_id, "used")
    assert [p.usd for p in used if p.user] == [123.45]
    assert catalog.cheapest_cloud_price(gpu_id) is not None
    mine = [p for p in catalog.prices(gpu_id) if p.user]
    assert {p.source for p in mine} == {"my own search", "quote 17"}
    # replacing: the same key given twice by the user keeps both user rows, none shipped
    key_rows = [
        p for p in catalog.prices(gpu_id, "used") if p.provider == "ebay" and p.region == "US"
    ]
    assert all(p.user for p in key_rows)


def test_default_user_price_file_is_read(tmp_path: Path, _isolated_config: Path) -> None:
    gpu_id = _first_shipped_gpu()
    _isolated_config.mkdir(parents=True)
    (_isolated_config / "prices.csv").write_text(
        HEADER + f"{gpu_id},new,777,unit,shop,US,2026-01-02,receipt,\n"
    )
    assert [p.usd for p in load_catalog().prices(gpu_id, "new") if p.user] == [777]
    assert not [p for p in load_catalog([]).prices(gpu_id) if p.user]


def test_missing_explicit_price_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PriceFileError, match="cannot be read"):
        load_catalog([tmp_path / "absent.csv"])


def test_a_user_price_file_names_gpus_as_the_commands_do(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(HEADER + "4090,new,1700,unit,,US,2025-01-01,my quote,\n", encoding="utf-8")
    (price,) = [p for p in load_catalog([path]).prices("rtx-4090", "new") if p.user]
    assert price.usd == 1700
    assert price.note is not None and "'4090' read as rtx-4090" in price.note
    path.write_text(HEADER + "A100,new,9000,unit,,,2025-01-01,my quote,\n", encoding="utf-8")
    with pytest.raises(PriceFileError, match="matches 4 GPUs") as err:
        load_catalog([path])
    assert err.value.field == "gpu_id"
    path.write_text(HEADER + "rtx 4900,new,1,unit,,,2025-01-01,my quote,\n", encoding="utf-8")
    with pytest.raises(PriceFileError, match=r"Did you mean: rtx-4090"):
        load_catalog([path])


def test_a_price_file_refuses_an_amount_beyond_any_answer(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(HEADER + "rtx-4090,new,1e300,unit,,,2025-01-01,me,\n", encoding="utf-8")
    with pytest.raises(PriceFileError, match="at most 1e"):
        load_catalog([path])
