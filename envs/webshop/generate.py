"""Synthetic WebShop catalogues in upstream's raw JSON schemas (items_shuffle.json,
items_ins_v2.json, items_human_ins.json), for users without the real data.

Products come from per-category product types (WebShop's five coarse categories: beauty,
electronics, fashion, food, furniture), each with a search query, an Amazon-style '›' category
path, an attribute pool, option groups (colour, size, flavour, capacity, ...) and a price range.
Every product gets a synthetic instruction with 1-3 of its attributes (items_ins_v2) and one or two
crowd-style instructions with options (items_human_ins). Option values are chosen so that
upstream's colour normalisation keeps them matchable (the normalised colour is one of the value's
own words), so buying the right product with the right options scores exactly 1.0.
Deterministic in (num_products, seed).
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.webshop.raw import RawCatalogue


@dataclass(frozen=True)
class ProductType:
    noun: str  # e.g. "dress shirt"
    query: str
    category: str
    path: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]
    features: tuple[str, ...]


_COLORS = (
    "Black",
    "White",
    "Navy Blue",
    "Light Grey",
    "Red",
    "Olive Green",
    "Beige",
    "Pink",
    "Dark Brown",
    "Burgundy",
)
_SIZES = ("Small", "Medium", "Large", "X-Large", "XX-Large")
_SHOE_SIZES = ("7", "8", "9", "10", "11", "12")

_TYPES: tuple[ProductType, ...] = (
    ProductType("dress shirt", "men's dress shirts", "fashion",
                "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › Dress Shirts",
                ("machine wash", "slim fit", "long sleeve", "button closure", "cotton spandex", "wrinkle free"),
                (("Color", _COLORS), ("Size", _SIZES)), (15.0, 45.0), ("breathable cotton blend", "spread collar")),
    ProductType("running shoes", "women's running shoes", "fashion",
                "Clothing, Shoes & Jewelry › Women › Shoes › Athletic › Running",
                ("rubber sole", "lace up", "memory foam", "non slip", "lightweight", "arch support"),
                (("Color", _COLORS), ("Size", _SHOE_SIZES)), (30.0, 90.0), ("mesh upper", "cushioned midsole")),
    ProductType("hoodie", "pullover hoodies", "fashion",
                "Clothing, Shoes & Jewelry › Men › Clothing › Fashion Hoodies & Sweatshirts",
                ("machine wash", "fleece lined", "drawstring closure", "relaxed fit", "kangaroo pocket"),
                (("Color", _COLORS), ("Size", _SIZES)), (20.0, 55.0), ("soft brushed fleece", "ribbed cuffs")),
    ProductType("face moisturizer", "face moisturizer for dry skin", "beauty",
                "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers",
                ("paraben free", "cruelty free", "dry skin", "hyaluronic acid", "fragrance free", "long lasting"),
                (("Size", ("1.7 Fl Oz", "3.4 Fl Oz", "8 Ounce")),), (8.0, 40.0), ("absorbs quickly", "dermatologist tested")),
    ProductType("shampoo", "sulfate free shampoo", "beauty",
                "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos",
                ("sulfate free", "natural ingredients", "damaged hair", "color safe", "cruelty free"),
                (("Scent", ("Lavender", "Coconut", "Rose", "Mint")), ("Size", ("12 Fl Oz", "16 Fl Oz", "32 Fl Oz"))),
                (6.0, 30.0), ("gentle daily cleanse", "salon quality")),
    ProductType("lipstick", "matte lipstick", "beauty",
                "Beauty & Personal Care › Makeup › Lips › Lipstick",
                ("long lasting", "matte finish", "cruelty free", "highly pigmented", "paraben free"),
                (("Color", ("Red", "Pink", "Burgundy", "Coral", "Nude")),), (5.0, 25.0), ("creamy formula", "smudge proof")),
    ProductType("wireless earbuds", "bluetooth earbuds", "electronics",
                "Electronics › Headphones, Earbuds & Accessories › Earbud Headphones",
                ("noise cancelling", "bluetooth 5.0", "charging case", "water resistant", "long battery life"),
                (("Color", ("Black", "White", "Navy Blue")),), (20.0, 120.0), ("touch controls", "built in microphone")),
    ProductType("usb c charger", "fast usb c charger", "electronics",
                "Electronics › Computers & Accessories › Chargers & Adapters",
                ("fast charging", "usb c", "compact design", "overheat protection", "travel friendly"),
                (("Wattage", ("20W", "30W", "65W")), ("Color", ("Black", "White"))), (10.0, 45.0), ("foldable plug", "universal compatibility")),
    ProductType("tablet", "android tablet", "electronics",
                "Electronics › Computers & Accessories › Tablets",
                ("hd display", "quad core", "long battery life", "expandable storage", "dual camera"),
                (("Capacity", ("32GB", "64GB", "128GB")), ("Color", ("Black", "Silver"))), (80.0, 260.0), ("10 inch screen", "parental controls")),
    ProductType("green tea", "organic green tea bags", "food",
                "Grocery & Gourmet Food › Beverages › Tea › Green",
                ("usda organic", "non gmo", "gluten free", "caffeine free", "individually wrapped"),
                (("Size", ("20 Count", "50 Count", "100 Count")),), (5.0, 25.0), ("hand picked leaves", "smooth taste")),
    ProductType("protein bar", "high protein snack bars", "food",
                "Grocery & Gourmet Food › Snack Foods › Bars › Protein Bars",
                ("high protein", "gluten free", "low sugar", "non gmo", "keto friendly"),
                (("Flavor", ("Chocolate", "Peanut Butter", "Vanilla Almond")), ("Size", ("6 Pack", "12 Pack"))),
                (10.0, 35.0), ("chewy texture", "post workout snack")),
    ProductType("coffee beans", "whole bean coffee", "food",
                "Grocery & Gourmet Food › Beverages › Coffee › Whole Coffee Beans",
                ("medium roast", "fair trade", "single origin", "usda organic", "small batch"),
                (("Size", ("12 Ounce", "2 Pound")),), (9.0, 38.0), ("rich aroma", "notes of cocoa")),
    ProductType("office chair", "ergonomic office chair", "furniture",
                "Home & Kitchen › Furniture › Home Office Furniture › Home Office Chairs",
                ("lumbar support", "adjustable height", "easy assembly", "breathable mesh", "swivel wheels"),
                (("Color", ("Black", "Light Grey", "White")),), (60.0, 240.0), ("padded armrests", "tilt lock")),
    ProductType("bookshelf", "wooden bookshelf", "furniture",
                "Home & Kitchen › Furniture › Living Room Furniture › Bookcases",
                ("easy assembly", "solid wood", "space saving", "living room", "sturdy construction"),
                (("Color", ("White", "Dark Brown", "Black")), ("Size", ("3 Tier", "5 Tier"))), (40.0, 180.0), ("open shelves", "anti tip kit")),
    ProductType("bed sheet set", "queen bed sheets", "furniture",
                "Home & Kitchen › Bedding › Sheets & Pillowcases › Sheet & Pillowcase Sets",
                ("deep pocket", "machine wash", "breathable", "wrinkle free", "microfiber"),
                (("Color", ("White", "Light Grey", "Navy Blue", "Beige")), ("Size", ("Twin", "Full", "Queen", "King"))),
                (20.0, 70.0), ("silky soft", "fade resistant")),
)  # fmt: skip

_BRANDS = (
    "Northwind",
    "Bellamy",
    "Aurora",
    "Kestrel",
    "Summit",
    "Lumen",
    "Harbor",
    "Vireo",
    "Oakline",
    "Marlow",
)
_LINES = (
    "Classic",
    "Essential",
    "Premium",
    "Pro",
    "Lite",
    "Plus",
    "Signature",
    "Everyday",
    "Studio",
    "Urban",
)
_SYNTHETIC_TEMPLATES = (
    "i need a {attrs} {noun}",
    "i am looking for a {noun} that is {attrs}",
    "i want a {attrs} {noun}",
    "find me a {noun} which is {attrs}",
)
_HUMAN_TEMPLATES = (
    "i'm looking for a {attr} {noun}{opts}.",
    "i would like to buy a {noun} that is {attr}{opts}.",
    "get me a {attr} {noun}{opts}.",
)


def _asin(rng: random.Random, used: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choices(string.ascii_uppercase + string.digits, k=8))
        if asin not in used:
            used.add(asin)
            return asin


def _money(value: float) -> str:
    return f"${value:.2f}"


def _product(
    kind: ProductType, rng: random.Random, asin: str
) -> tuple[dict[str, Any], dict[str, Any], list[dict]]:
    brand = rng.choice(_BRANDS)
    attributes = rng.sample(kind.attributes, k=min(len(kind.attributes), rng.randint(3, 5)))
    options = {}
    for name, values in kind.options:
        if rng.random() < 0.85:
            options[name] = rng.sample(values, k=min(len(values), rng.randint(2, 4)))
    title_attrs = " ".join(a.title() for a in attributes[:2])
    line = rng.choice(_LINES)
    title = f"{brand} {line} {title_attrs} {kind.noun.title()}, {kind.features[0].title()}"
    low, high = kind.price
    price = round(rng.uniform(low, high), 2)
    pricing = (
        _money(price)
        if rng.random() < 0.7
        else _money(price) + _money(round(price * rng.uniform(1.1, 1.5), 2))
    )
    bullets = [f"{a.capitalize()}: {rng.choice(kind.features)} for everyday use." for a in attributes]
    description = (
        f"The {brand} {kind.noun} is built for comfort and value. It is {attributes[0]} and "
        f"{attributes[1] if len(attributes) > 1 else 'durable'}, with {kind.features[1]}."
    )
    raw = {
        "asin": asin,
        "name": title,
        "full_description": description,
        "small_description": bullets,
        "pricing": pricing,
        "customization_options": {
            name: [
                {"value": v, "image": f"https://example.invalid/images/{asin}/{i}.jpg"}
                for i, v in enumerate(vals)
            ]
            for name, vals in options.items()
        },
        "images": [f"https://example.invalid/images/{asin}/main.jpg"],
        "category": kind.category,
        "query": kind.query,
        "product_category": kind.path,
    }
    wanted = rng.sample(attributes, k=rng.randint(1, min(3, len(attributes))))
    joined = " and ".join(wanted)
    instruction = rng.choice(_SYNTHETIC_TEMPLATES).format(attrs=joined, noun=kind.noun)
    ins = {"attributes": attributes, "instruction": instruction, "instruction_attributes": wanted}
    human = []
    for _ in range(rng.randint(1, 2)):
        attr = rng.choice(attributes)
        chosen = [rng.choice(vals).lower() for vals in options.values()]
        opts = (" in " + " and ".join(chosen)) if chosen else ""
        text = rng.choice(_HUMAN_TEMPLATES).format(attr=attr, noun=kind.noun, opts=opts)
        human.append(
            {
                "asin": asin,
                "instruction": text,
                "instruction_attributes": [attr],
                "instruction_options": chosen,
            }
        )
    return raw, ins, human


def generate_raw(*, num_products: int, seed: int) -> RawCatalogue:
    """An in-memory synthetic catalogue (product order already shuffled, as items_shuffle is)."""
    if num_products < 1:
        raise ValueError(f"num_products must be >= 1, got {num_products}")
    rng = random.Random(f"webshop-catalogue/{seed}")
    used: set[str] = set()
    products, attributes, human = [], {}, {}
    for i in range(num_products):
        kind = _TYPES[i % len(_TYPES)] if i < len(_TYPES) else rng.choice(_TYPES)
        raw, ins, human_ins = _product(kind, rng, _asin(rng, used))
        products.append(raw)
        attributes[raw["asin"]] = ins
        human[raw["asin"]] = human_ins
    rng.shuffle(products)
    return RawCatalogue(products, attributes, human)


def generate_catalogue(out: Path, *, num_products: int, seed: int) -> list[Path]:
    """Write the synthetic catalogue under upstream's file names; returns the written paths."""
    raw = generate_raw(num_products=num_products, seed=seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "items_shuffle.json": raw.products,
        "items_ins_v2.json": raw.attributes,
        "items_human_ins.json": raw.human_instructions,
    }
    paths = []
    for name, content in files.items():
        path = out / name
        path.write_text(json.dumps(content, indent=1))
        paths.append(path)
    return paths
