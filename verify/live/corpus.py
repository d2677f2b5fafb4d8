"""The haystack text the package ships: a seeded procedural generator of plain English.

Why procedural: the prompts must be reproducible byte for byte from a seed with no download, and
the text must be ours (no essays copied from anywhere). Word lists and sentence templates below were
written for this package. The filler never contains anything that looks like a needle value
(7-digit numbers, hex UUIDs, upper-case codes) or a hyphenated key, so exact-match scoring cannot be
fooled by the haystack.

Everything takes an explicit `random.Random`; nothing here keeps state between calls.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

# Bumped whenever generated text changes, so a resumed run refuses results built from other text.
CORPUS_VERSION = 1

NAMES = (
    "Ada",
    "Bram",
    "Clara",
    "Dov",
    "Elin",
    "Farid",
    "Greta",
    "Hugo",
    "Ines",
    "Jonas",
    "Kira",
    "Lior",
    "Mara",
    "Nils",
    "Odile",
    "Pavel",
    "Quinn",
    "Rosa",
    "Soren",
    "Tamsin",
    "Ugo",
    "Vera",
    "Wim",
    "Xenia",
    "Yusuf",
    "Zora",
    "Anouk",
    "Bastian",
    "Cosima",
    "Emeric",
)
PLACES = (
    "the harbor market",
    "the old mill",
    "the north orchard",
    "the lower bridge",
    "the reading room",
    "the bakery on the square",
    "the quiet chapel",
    "the ferry landing",
    "the hill farm",
    "the town archive",
    "the pottery yard",
    "the railway shed",
    "the lantern shop",
    "the school garden",
    "the salt marsh",
    "the weaving hall",
    "the river path",
    "the clock tower",
    "the stone quarry",
    "the fishing pier",
    "the herb terrace",
    "the copper workshop",
    "the village green",
    "the boat house",
)
NOUNS = (
    "basket",
    "lantern",
    "ledger",
    "kettle",
    "blanket",
    "compass",
    "map",
    "letter",
    "barrel",
    "rope",
    "window",
    "ladder",
    "bench",
    "bucket",
    "notebook",
    "violin",
    "parcel",
    "candle",
    "shovel",
    "sail",
    "wheel",
    "bridle",
    "quilt",
    "teapot",
    "hammer",
    "drawer",
    "curtain",
    "jar",
    "saddle",
    "spoon",
    "chair",
    "cart",
    "gate",
    "fence",
    "mirror",
    "shelf",
    "bell",
    "stove",
    "coat",
    "boot",
)
ADJECTIVES = (
    "small",
    "heavy",
    "faded",
    "bright",
    "quiet",
    "narrow",
    "wooden",
    "patient",
    "careful",
    "green",
    "dusty",
    "warm",
    "crooked",
    "polished",
    "gentle",
    "sturdy",
    "pale",
    "rough",
    "tidy",
    "worn",
    "early",
    "late",
    "steady",
    "curious",
    "plain",
    "golden",
    "damp",
    "open",
    "borrowed",
    "spare",
)
VERBS_PAST = (
    "carried",
    "mended",
    "painted",
    "counted",
    "wrapped",
    "cleaned",
    "moved",
    "opened",
    "checked",
    "sorted",
    "lifted",
    "fixed",
    "measured",
    "folded",
    "repaired",
    "polished",
    "stacked",
    "tied",
    "returned",
    "weighed",
    "labelled",
    "swept",
    "packed",
    "fetched",
)
WEATHER = (
    "a light rain",
    "a cold wind",
    "a clear sky",
    "thin fog",
    "a warm breeze",
    "heavy clouds",
    "soft snow",
    "low sunlight",
    "a sudden shower",
    "still air",
)
TIMES = (
    "in the morning",
    "before noon",
    "after lunch",
    "late in the afternoon",
    "at dusk",
    "early the next day",
    "on the second evening",
    "during the market week",
    "just after dawn",
    "on a slow Sunday",
)
FEELINGS = (
    "pleased",
    "tired",
    "surprised",
    "calm",
    "hopeful",
    "amused",
    "thoughtful",
    "relieved",
    "busy",
    "content",
)
TOPICS = (
    "the price of flour",
    "the new fence",
    "an old song",
    "the river level",
    "the harvest",
    "a lost key",
    "the weather",
    "the repairs",
    "the autumn fair",
    "a letter from the coast",
    "the school play",
    "the broken cart",
    "the spring planting",
    "the winter stores",
)

# Sentence templates: each slot name maps to one of the lists above (or a small number).
TEMPLATES = (
    "{name} {verb} the {adj} {noun} near {place} {time}.",
    "There was {weather} over {place}, so {name} stayed inside and {verb} a {noun}.",
    "{time_cap}, {name} and {name2} talked about {topic} at {place}.",
    "The {noun} at {place} had been {verb} twice, and it still looked {adj}.",
    "{name} felt {feeling} after the walk to {place}, where {weather} had settled.",
    "Nobody at {place} remembered who had {verb} the {adj} {noun}.",
    "{name2} wrote in the {noun} that {topic} was the talk of {place}.",
    "A {adj} {noun} stood by the door of {place} for {small} days.",
    "{time_cap}, {name} {verb} {small} {noun}s and set them by the {adj} {noun2}.",
    "Most people at {place} agreed that {topic} could wait until spring.",
    "{name} asked {name2} whether the {noun} from {place} was worth keeping.",
    "The walk from {place} to {place2} took {name} most of the day.",
    "With {weather} outside, the {adj} {noun} in {place} smelled of wood and rain.",
    "{name2} {verb} the {noun2} while {name} told a story about {topic}.",
    "It was {feeling} work, and by evening the {noun} at {place} was {verb} at last.",
    "{name} kept a {adj} {noun} in the kitchen, mostly out of habit.",
    "{time_cap}, a cart passed {place} carrying {small} {noun}s and a {adj} {noun2}.",
    "The children at {place} liked to guess how old the {noun} was.",
    "{name} said little about {topic}, but everyone could tell {pronoun} was {feeling}.",
    "After {weather}, the path to {place} was muddy for {small} days.",
    "{name2} found the {adj} {noun} behind the {noun2} at {place}.",
    "There is a {adj} {noun} at {place} that nobody is allowed to move.",
    "{name} and {name2} {verb} the {noun} together and then went home.",
    "By the time {name} reached {place}, {weather} had turned everything grey.",
)
PRONOUNS = ("she", "he", "they")

# Repetitive "noise" haystack (RULER's S3 idea: no semantics to lean on); our own wording.
NOISE_SENTENCES = (
    "The river runs low.",
    "The hills are quiet.",
    "The lamp is lit.",
    "The road goes on.",
    "Nothing else changes here.",
)

# Keys for needles: hyphenated pairs, a shape the filler never produces.
KEY_FIRST = (
    "amber",
    "cobalt",
    "silver",
    "crimson",
    "ivory",
    "jade",
    "onyx",
    "copper",
    "scarlet",
    "indigo",
    "saffron",
    "umber",
    "teal",
    "violet",
    "ochre",
    "slate",
    "pearl",
    "russet",
    "azure",
    "olive",
)
KEY_SECOND = (
    "falcon",
    "harbor",
    "meadow",
    "lantern",
    "glacier",
    "orchard",
    "canyon",
    "beacon",
    "willow",
    "summit",
    "thicket",
    "quarry",
    "estuary",
    "citadel",
    "prairie",
    "lagoon",
    "ridge",
    "grove",
    "delta",
    "spire",
)
# Needle codes in the style of the original report ("ZEBRA-4492-OMEGA").
CODE_FIRST = (
    "ZEBRA",
    "OTTER",
    "LYNX",
    "BISON",
    "HERON",
    "MARTEN",
    "IBEX",
    "CONDOR",
    "GECKO",
    "WALRUS",
    "TAPIR",
    "OSPREY",
    "FERRET",
    "JACKAL",
    "PUFFIN",
    "BADGER",
)
CODE_LAST = (
    "OMEGA",
    "ALPHA",
    "DELTA",
    "SIGMA",
    "KAPPA",
    "THETA",
    "GAMMA",
    "LAMBDA",
    "EPSILON",
    "ZETA",
    "IOTA",
    "OMICRON",
)
# Words used to pad a prompt to an exact token count: short, common, usually one token each.
PAD_WORDS = (
    "stone",
    "river",
    "lamp",
    "field",
    "house",
    "bread",
    "chair",
    "cloud",
    "paper",
    "glass",
    "road",
    "apple",
    "table",
    "grass",
    "shell",
    "rain",
    "door",
    "hill",
    "salt",
    "wood",
)


def stable_seed(*parts: object) -> int:
    """A 64-bit seed from any printable parts; stable across processes (unlike `hash`)."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def sentence(rng: random.Random) -> str:
    """One filler sentence."""
    template = rng.choice(TEMPLATES)
    name, name2 = rng.sample(NAMES, 2)
    place, place2 = rng.sample(PLACES, 2)
    noun, noun2 = rng.sample(NOUNS, 2)
    time = rng.choice(TIMES)
    return template.format(
        name=name,
        name2=name2,
        place=place,
        place2=place2,
        noun=noun,
        noun2=noun2,
        adj=rng.choice(ADJECTIVES),
        verb=rng.choice(VERBS_PAST),
        weather=rng.choice(WEATHER),
        time=time,
        time_cap=time[0].upper() + time[1:],
        feeling=rng.choice(FEELINGS),
        topic=rng.choice(TOPICS),
        small=rng.choice(("two", "three", "four", "five", "six", "seven")),
        pronoun=rng.choice(PRONOUNS),
    )


def paragraph(rng: random.Random, n_sentences: int) -> str:
    return " ".join(sentence(rng) for _ in range(n_sentences))


class SentenceStream:
    """Sentence i of a seeded stream, generated on demand and memoised.

    Why a stream: the prompt fitter renders the same haystack with different sentence counts; a
    prefix of the stream must not change when more sentences are requested.
    """

    def __init__(self, seed: int, noise: bool = False) -> None:
        self._rng = random.Random(seed)
        self._noise = noise
        self._items: list[str] = []

    def get(self, i: int) -> str:
        while len(self._items) <= i:
            if self._noise:
                self._items.append(NOISE_SENTENCES[len(self._items) % len(NOISE_SENTENCES)])
            else:
                self._items.append(sentence(self._rng))
        return self._items[i]


def pad_text(n_words: int) -> str:
    return " ".join(PAD_WORDS[i % len(PAD_WORDS)] for i in range(n_words))


class ValueFactory:
    """Needle keys and values, unique within one prompt."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._used: set[str] = set()

    def _take(self, candidate_fn: Callable[[], str]) -> str:
        for _ in range(1000):
            value = candidate_fn()
            if value not in self._used:
                self._used.add(value)
                return value
        raise RuntimeError("value space exhausted")

    def number(self) -> str:
        """A 7-digit number (RULER's niah value)."""
        return self._take(lambda: str(self._rng.randint(1_000_000, 9_999_999)))

    def uuid(self) -> str:
        """A UUID-shaped lower-case hex key (not a real UUID: seeded, so reproducible)."""

        def make() -> str:
            h = f"{self._rng.getrandbits(128):032x}"
            return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

        return self._take(make)

    def code(self) -> str:
        """An upper-case code like ZEBRA-4492-OMEGA."""
        return self._take(
            lambda: (
                f"{self._rng.choice(CODE_FIRST)}-{self._rng.randint(1000, 9999)}-"
                f"{self._rng.choice(CODE_LAST)}"
            )
        )

    def value(self, kind: str) -> str:
        if kind == "number":
            return self.number()
        if kind == "uuid":
            return self.uuid()
        if kind == "code":
            return self.code()
        raise ValueError(f"unknown value kind {kind!r}")

    def key(self) -> str:
        return self._take(lambda: f"{self._rng.choice(KEY_FIRST)}-{self._rng.choice(KEY_SECOND)}")

    def similar_key(self, key: str) -> str:
        """A distractor key sharing one half with `key` (confusable on purpose)."""
        first, second = key.split("-", 1)

        def make() -> str:
            if self._rng.random() < 0.5:
                return f"{first}-{self._rng.choice(KEY_SECOND)}"
            return f"{self._rng.choice(KEY_FIRST)}-{second}"

        return self._take(make)

    def shipment_id(self) -> str:
        return self._take(lambda: f"SHP-{self._rng.randint(10000, 99999)}")
