"""A hand-written 4-product catalogue in upstream's raw schemas (known texts for page goldens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs.webshop.catalogue import build_catalogue
from envs.webshop.raw import RawCatalogue

SHIRT_CATEGORY = "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › Dress Shirts"


def _opt(*values: str) -> list[dict]:
    return [{"value": v, "image": None} for v in values]


RAW_PRODUCTS = [
    {
        "asin": "B000000001", "name": "Men's Slim Fit Cotton Dress Shirt, Long Sleeve",
        "full_description": "A slim fit dress shirt for the office.",
        "small_description": ["100% cotton", "Button closure"], "pricing": "$24.99",
        "customization_options": {"Color": _opt("Navy Blue", "White"), "Size": _opt("Medium", "Large")},
        "images": ["img1"], "category": "fashion", "query": "Men's Dress Shirts ",
        "product_category": SHIRT_CATEGORY,
    },
    {
        "asin": "B000000002", "name": "Men's Regular Fit Oxford Shirt",
        "full_description": "Classic oxford weave. Machine wash cold.",
        "small_description": "Regular fit", "pricing": "$18.00$30.00",
        "customization_options": {"Color": _opt("Red/Black", "Light Grey")},
        "images": ["img2"], "category": "fashion", "query": "men's oxford shirts",
        "product_category": "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › Casual Button-Down Shirts",
    },
    {
        "asin": "B000000003", "name": "Organic Green Tea Bags, 100 Count",
        "full_description": "", "small_description": ["Caffeine free", ""], "pricing": "",
        "customization_options": None, "images": ["img3"], "category": "food", "query": "green tea",
        "product_category": "Grocery & Gourmet Food › Beverages › Tea › Green",
    },
    {
        "asin": "B000000004", "name": "Wireless Bluetooth Earbuds with Charging Case",
        "full_description": "Noise cancelling earbuds.", "small_description": ["Bluetooth 5.0"],
        "pricing": "$1,299.50", "customization_options": {"Color": _opt("Black")},
        "images": ["img4"], "category": "electronics", "query": "bluetooth earbuds",
        "product_category": "Electronics › Headphones › Earbuds",
    },
    {"asin": "B000000001", "name": "duplicate asin: skipped", "full_description": "", "small_description": [],
     "pricing": "$1", "customization_options": {}, "images": [""], "category": "", "query": "",
     "product_category": ""},
    {"asin": "nan", "name": "nan asin: skipped", "full_description": "", "small_description": [],
     "pricing": "$1", "customization_options": {}, "images": [""], "category": "", "query": "",
     "product_category": ""},
]  # fmt: skip

RAW_ATTRIBUTES = {
    "B000000001": {
        "attributes": ["slim fit", "long sleeve"],
        "instruction": "i need a slim fit men's dress shirt",
        "instruction_attributes": ["slim fit", "machine wash"],
    },
    "B000000002": {
        "attributes": ["regular fit"],
        "instruction": "i want an oxford shirt",
        "instruction_attributes": ["regular fit"],
    },
    "B000000004": {"attributes": ["noise cancelling"]},
}
RAW_HUMAN = {
    "B000000001": [
        {
            "instruction": "i want a navy blue dress shirt in large that is slim fit.",
            "instruction_attributes": ["slim fit"],
            "instruction_options": ["navy blue", "large"],
        },
        {"instruction": "no attributes here", "instruction_attributes": [], "instruction_options": []},
    ],
    "B000000003": [
        {
            "instruction": "i need caffeine free green tea",
            "instruction_attributes": ["caffeine free"],
            "instruction_options": [],
        }
    ],
}


@pytest.fixture
def raw() -> RawCatalogue:
    return RawCatalogue(
        json.loads(json.dumps(RAW_PRODUCTS)),
        json.loads(json.dumps(RAW_ATTRIBUTES)),
        json.loads(json.dumps(RAW_HUMAN)),
    )


@pytest.fixture
def synthetic(raw: RawCatalogue):
    return build_catalogue(raw, "synthetic", seed=0)


@pytest.fixture
def human(raw: RawCatalogue):
    return build_catalogue(raw, "human", seed=0)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    (tmp_path / "items_shuffle_1000.json").write_text(json.dumps(RAW_PRODUCTS))
    (tmp_path / "items_ins_v2_1000.json").write_text(json.dumps(RAW_ATTRIBUTES))
    (tmp_path / "items_human_ins.json").write_text(json.dumps(RAW_HUMAN))
    return tmp_path
