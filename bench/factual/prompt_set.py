"""The factual set of `bench factual`: 200 distinct prompts, each with a regular expression for the right
answer, built from facts a 135M model often knows and asked in several phrasings of the same fact.

    topic        facts  phrasings  prompts
    capitals       20       4         80   "What is the capital of X?", "What's ...", "Name ...", "X's ..."
    colours         8       2         16
    arithmetic     12       2         24   small sums
    numbers         8       2         16   days in a week, legs of a spider, ...
    calendar        8       2         16   the day after Monday, the first month, ...
    opposites       8       2         16
    animal sounds   8       2         16
    world           8       2         16   the largest planet, frozen water, ...

Several phrasings of one fact are there so that a weak model misses some of them: a model that knows
the fact in one wording and not another is what the set measures, and an engine whose numerics are
wrong turns a right answer into a wrong one whichever the wording. Every third prompt (by position)
starts with `SHARED_SYSTEM`, the same long system prompt, so a served run sees prefix-cache hits;
the others get the chat template's own default system prompt (a shorter shared prefix).

A prompt is answered right when its `pattern` matches the answer anywhere (`re.search`, ignoring
case); `answer` is the canonical right answer, which its own pattern must match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SHARED_SYSTEM = (
    "You are a careful quiz assistant for a primary school class. The children ask short questions about "
    "geography, colours, numbers, the calendar, words, animals and the world around them. Answer each "
    "question correctly and briefly, in one short sentence, using plain words that a child understands. "
    "When the answer is a name, a number or a single word, say it clearly in your sentence. Do not add "
    "facts that were not asked for, do not ask a question back, and do not repeat yourself. Keep a kind "
    "and friendly tone. The questions follow, one at a time."
)
SYSTEM_EVERY = 3  # prompts 0, 3, 6, ... carry SHARED_SYSTEM


@dataclass(frozen=True)
class FactualPrompt:
    id: str  # "capitals-france-2": topic, fact, phrasing
    topic: str
    fact: str
    question: str
    pattern: str  # case-insensitive regular expression of the right answer
    answer: str  # the canonical right answer (its own pattern matches it)
    system: str | None = None

    def messages(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return [*head, {"role": "user", "content": self.question}]

    def is_right(self, text: str | None) -> bool:
        return text is not None and re.search(self.pattern, text, re.IGNORECASE) is not None

    def to_dict(self) -> dict[str, str | None]:
        return {
            "id": self.id,
            "topic": self.topic,
            "fact": self.fact,
            "question": self.question,
            "pattern": self.pattern,
            "answer": self.answer,
            "system": "shared" if self.system else None,
        }


def _word(*words: str) -> str:
    return r"\b(?:" + "|".join(words) + r")\b"


_NUMBER_WORDS = {
    2: "two",
    3: "three",
    4: "four",
    5: "five",
    6: "six",
    7: "seven",
    8: "eight",
    9: "nine",
    10: "ten",
    12: "twelve",
    15: "fifteen",
    20: "twenty",
    24: "twenty-four",
    50: "fifty",
    60: "sixty",
    100: "hundred",
}


def _number(n: int) -> str:
    return _word(str(n), _NUMBER_WORDS[n]) if n in _NUMBER_WORDS else _word(str(n))


CAPITALS: tuple[tuple[str, str, str], ...] = (  # country, capital, pattern
    ("France", "Paris", _word("paris")),
    ("Italy", "Rome", _word("rome", "roma")),
    ("Spain", "Madrid", _word("madrid")),
    ("Germany", "Berlin", _word("berlin")),
    ("Japan", "Tokyo", _word("tokyo")),
    ("the United Kingdom", "London", _word("london")),
    ("Russia", "Moscow", _word("moscow")),
    ("China", "Beijing", _word("beijing", "peking")),
    ("Egypt", "Cairo", _word("cairo")),
    ("Greece", "Athens", _word("athens")),
    ("Portugal", "Lisbon", _word("lisbon", "lisboa")),
    ("Canada", "Ottawa", _word("ottawa")),
    ("Australia", "Canberra", _word("canberra")),
    ("Ireland", "Dublin", _word("dublin")),
    ("Austria", "Vienna", _word("vienna", "wien")),
    ("Norway", "Oslo", _word("oslo")),
    ("Sweden", "Stockholm", _word("stockholm")),
    ("Poland", "Warsaw", _word("warsaw")),
    ("Mexico", "Mexico City", r"\bmexico city\b"),
    ("Thailand", "Bangkok", _word("bangkok")),
)
CAPITAL_PHRASINGS = (
    "What is the capital of {c}?",
    "What's the capital of {c}?",
    "Name the capital city of {c}.",
    "{C}'s capital is which city?",
)

# (fact, answer, pattern, phrasing 1, phrasing 2)
Fact = tuple[str, str, str, str, str]
COLOURS: tuple[Fact, ...] = (
    ("sky", "blue", _word("blue"), "What colour is the sky on a clear day?", "What color is a clear daytime sky?"),
    ("grass", "green", _word("green"), "What colour is grass?", "What color is fresh grass?"),
    ("snow", "white", _word("white"), "What colour is snow?", "Fresh snow is what color?"),
    ("banana", "yellow", _word("yellow"), "What colour is a ripe banana?", "What color are ripe bananas?"),
    ("blood", "red", _word("red"), "What colour is blood?", "What color is human blood?"),
    ("coal", "black", _word("black"), "What colour is coal?", "Coal is what color?"),
    ("carrot", "orange", _word("orange"), "What colour is a carrot?", "What color are carrots usually?"),
    ("milk", "white", _word("white"), "What colour is milk?", "What color is cow's milk?"),
)
SUMS: tuple[tuple[int, int], ...] = (
    (1, 1),
    (2, 2),
    (2, 3),
    (3, 3),
    (3, 4),
    (4, 4),
    (6, 3),
    (5, 5),
    (7, 5),
    (10, 5),
    (10, 10),
    (20, 30),
)
SUM_PHRASINGS = ("What is {a} plus {b}?", "How much is {a} + {b}?")
NUMBERS: tuple[Fact, ...] = (
    ("week", "7", _number(7), "How many days are there in a week?", "A week has how many days?"),
    ("year", "12", _number(12), "How many months are there in a year?", "A year has how many months?"),
    ("day", "24", _number(24), "How many hours are there in a day?", "A day has how many hours?"),
    ("hour", "60", _number(60), "How many minutes are there in an hour?", "An hour has how many minutes?"),
    ("spider", "8", _number(8), "How many legs does a spider have?", "A spider has how many legs?"),
    ("dog", "4", _number(4), "How many legs does a dog have?", "A dog has how many legs?"),
    ("triangle", "3", _number(3), "How many sides does a triangle have?", "A triangle has how many sides?"),
    ("bicycle", "2", _number(2), "How many wheels does a bicycle have?", "A bicycle has how many wheels?"),
)
CALENDAR: tuple[Fact, ...] = (
    *(
        (day.lower(), nxt, _word(nxt.lower()), f"What day comes after {day}?", f"Which day of the week follows {day}?")
        for day, nxt in (
            ("Monday", "Tuesday"),
            ("Tuesday", "Wednesday"),
            ("Wednesday", "Thursday"),
            ("Thursday", "Friday"),
            ("Friday", "Saturday"),
            ("Saturday", "Sunday"),
        )
    ),
    (
        "first-month",
        "January",
        _word("january"),
        "What is the first month of the year?",
        "Which month starts the year?",
    ),
    ("last-month", "December", _word("december"), "What is the last month of the year?", "Which month ends the year?"),
)
OPPOSITES: tuple[tuple[str, str, str], ...] = (
    ("hot", "cold", _word("cold")),
    ("big", "small", _word("small", "little", "tiny")),
    ("up", "down", _word("down")),
    ("day", "night", _word("night")),
    ("fast", "slow", _word("slow")),
    ("happy", "sad", _word("sad", "unhappy")),
    ("open", "closed", _word("closed?", "shut")),
    ("black", "white", _word("white")),
)
OPPOSITE_PHRASINGS = ("What is the opposite of {w}?", "Give the opposite of the word '{w}'.")
SOUNDS: tuple[tuple[str, str, str], ...] = (
    ("dog", "bark", _word("barks?", "barking", "woof")),
    ("cat", "meow", _word("meows?", "miaow", "purrs?")),
    ("cow", "moo", _word("moos?")),
    ("duck", "quack", _word("quacks?")),
    ("sheep", "baa", _word("baa+", "bleats?")),
    ("lion", "roar", _word("roars?")),
    ("pig", "oink", _word("oinks?", "grunts?", "snorts?")),
    ("horse", "neigh", _word("neighs?", "whinny", "whinnies")),
)
SOUND_PHRASINGS = ("What sound does a {a} make?", "What noise does a {a} make?")
WORLD: tuple[Fact, ...] = (
    (
        "largest-planet",
        "Jupiter",
        _word("jupiter"),
        "What is the largest planet in our solar system?",
        "Which planet is the biggest in the solar system?",
    ),
    ("our-planet", "Earth", _word("earth"), "What planet do we live on?", "Which planet is our home?"),
    ("ice", "ice", _word("ice"), "What is frozen water called?", "What do we call water when it freezes?"),
    (
        "sun",
        "the Sun",
        _word("sun"),
        "What star is at the centre of our solar system?",
        "Which star do the planets of our solar system orbit?",
    ),
    (
        "water-formula",
        "H2O",
        r"\bh\s?2\s?o\b|h₂o",
        "What is the chemical formula of water?",
        "Water's chemical formula is what?",
    ),
    (
        "largest-ocean",
        "the Pacific",
        _word("pacific"),
        "What is the largest ocean on Earth?",
        "Which ocean is the biggest?",
    ),
    ("bees", "honey", _word("honey"), "What sweet food do bees make?", "Bees make which sweet food?"),
    (
        "boiling",
        "100",
        _number(100),
        "At how many degrees Celsius does water boil at sea level?",
        "Water boils at what temperature in degrees Celsius?",
    ),
)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _rows() -> list[tuple[str, str, str, str, str]]:
    """(topic, fact, question, pattern, answer) in a fixed order."""
    rows = []
    for country, capital, pattern in CAPITALS:
        for phrasing in CAPITAL_PHRASINGS:
            question = phrasing.format(c=country, C=country[0].upper() + country[1:])
            rows.append(("capitals", _slug(country.removeprefix("the ")), question, pattern, capital))
    for topic, facts in (("colours", COLOURS), ("numbers", NUMBERS), ("calendar", CALENDAR), ("world", WORLD)):
        if topic == "numbers":
            for a, b in SUMS:
                rows += [
                    ("arithmetic", f"{a}-plus-{b}", p.format(a=a, b=b), _number(a + b), str(a + b))
                    for p in SUM_PHRASINGS
                ]
        for fact, answer, pattern, first, second in facts:
            rows += [(topic, fact, first, pattern, answer), (topic, fact, second, pattern, answer)]
    for word, opposite, pattern in OPPOSITES:
        rows += [("opposites", word, p.format(w=word), pattern, opposite) for p in OPPOSITE_PHRASINGS]
    for animal, sound, pattern in SOUNDS:
        rows += [("animal-sounds", animal, p.format(a=animal), pattern, sound) for p in SOUND_PHRASINGS]
    return rows


def build_set() -> tuple[FactualPrompt, ...]:
    prompts = []
    seen: dict[str, int] = {}
    for index, (topic, fact, question, pattern, answer) in enumerate(_rows()):
        key = f"{topic}-{fact}"
        seen[key] = seen.get(key, 0) + 1
        system = SHARED_SYSTEM if index % SYSTEM_EVERY == 0 else None
        prompts.append(FactualPrompt(f"{key}-{seen[key]}", topic, fact, question, pattern, answer, system))
    return tuple(prompts)


PROMPTS: tuple[FactualPrompt, ...] = build_set()
TOPICS: tuple[str, ...] = tuple(dict.fromkeys(p.topic for p in PROMPTS))
