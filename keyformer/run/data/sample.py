"""Embedded synthetic ``sample`` dataset: find one key fact of a long report among distractors.

Everything is generated here from small word lists (no copied text), deterministically from a seed.
Each record is a fictional report: a *lede* paragraph with the key facts of one event (a person, an
organisation, a place, an amount, a date, a count and the project's one-word *code name*) placed in the
first half of the document, as a news report puts its facts first, followed and preceded by unrelated
*distractor* paragraphs. The question after the report asks for the code name; the reference answer is
``The code name of the project is <word>.`` and ``answer`` is the word itself, so ``accuracy`` (is the
word in the prediction) and ROUGE reward a model whose KV cache kept the lede. A sliding window of half the
prompt has dropped it; full attention, H2O and Keyformer can still answer.
"""

from __future__ import annotations

import random

FIRST = ["Amara", "Bruno", "Celia", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Keiko",
         "Lorenzo", "Mireille", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Soren", "Tamsin"]
LAST = ["Okafor", "Lindqvist", "Moreau", "Vasquez", "Tanaka", "Brennan", "Haddad", "Kowalski", "Ferreira",
        "Nakamura", "Osei", "Petrov", "Quist", "Ramirez", "Stavros", "Thorne", "Umeh", "Varga", "Whitlock"]
PLACES = ["Port Alderny", "Kestrel Bay", "Marrowfield", "Lowen Falls", "Quarry Hill", "Saltmere",
          "Brightwater",
          "Eastholm", "Fernhollow", "Greyhaven", "Harrowgate Vale", "Ironbridge Cross", "Juniper Point"]
ORGS = ["the Northgate Water Authority", "the Coastal Rail Company", "the Meridian Health Trust",
        "the Silverline Energy Cooperative", "the Harbor Schools Board", "the Tidewater Housing Fund",
        "the Valley Transit Agency", "the Orchard Growers Union", "the Civic Library Network"]
ROLES = ["chief executive", "director", "chair", "spokesperson", "lead engineer", "treasurer"]
PROJECTS = ["a new desalination plant", "a tram line to the old docks", "a children's hospital wing",
            "a solar farm on reclaimed land", "three new primary schools", "400 affordable homes",
            "an electric bus depot", "a flood barrier along the river", "a central public library"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
TOPICS = ["the weather", "local history", "a football season", "the farmers' market", "a museum exhibit",
          "road maintenance", "a choir competition", "the autumn festival", "birdwatching", "a bakery"]
ADJ = ["quiet", "busy", "pleasant", "unremarkable", "familiar", "lively", "grey", "windy", "ordinary"]
# One-token words (with a leading space) in SmolLM2's vocabulary, unlike any place, organisation or name
# above.
CODE_NAMES = ["falcon", "copper", "lantern", "violet", "thunder", "orchid", "canyon", "comet", "walnut",
              "saffron",
              "marble", "anchor", "barley", "cobalt", "crystal", "glacier", "hazel", "ivory", "kettle",
              "lemon",
              "mango", "nectar", "olive", "pepper", "quartz", "ribbon", "sparrow", "timber", "velvet",
              "wagon",
              "cedar", "tiger", "rocket", "pillow", "candle", "dragon", "eagle", "hammer", "mirror", "needle"]
QUESTION = "What is the code name of the project?"
INSTRUCTION = "Answer the question at the end of the report."
FILLER = [
    "Residents said that {topic} had been a {adj} subject of conversation for most of the week.",
    "Several visitors remarked that {topic} reminded them of earlier years, though opinions differed.",
    "A short article in the weekly newsletter described {topic} in some detail.",
    "Shop owners on the main street reported that {topic} had little effect on their trade.",
    "Older residents recalled that {topic} used to draw larger crowds than it does today.",
    "The council's notice board carried a {adj} announcement about {topic} and opening hours.",
    "Volunteers spent the afternoon discussing {topic} over tea in the community hall.",
    "Nobody interviewed expected {topic} to change much before the end of the season.",
]


def _fact_sentences(rng: random.Random) -> tuple[list[str], list[str]]:
    """Return (key-fact sentences, summary sentences) for one fictional event."""
    person = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    role, org = rng.choice(ROLES), rng.choice(ORGS)
    place, project = rng.choice(PLACES), rng.choice(PROJECTS)
    cost = rng.randint(12, 950)
    day, month, year = rng.randint(1, 28), rng.choice(MONTHS), rng.randint(2026, 2031)
    jobs, votes_for = rng.randint(40, 900), rng.randint(5, 9)
    facts = [
        f"{person}, the {role} of {org}, announced that {project} will be built in {place}.",
        f"The project is expected to cost {cost} million dollars, according to {person}.",
        f"Construction is scheduled to be completed on {day} {month} {year}.",
        f"The plan was approved by a vote of {votes_for} to {9 - votes_for} and is expected to create"
        f" {jobs} jobs in {place}.",
    ]
    summary = [
        f"{person} of {org} announced {project} in {place}.",
        f"It will cost {cost} million dollars and create {jobs} jobs.",
        f"Completion is planned for {day} {month} {year}.",
    ]
    return facts, summary


def _distractor(rng: random.Random, n_sentences: int = 4) -> str:
    return " ".join(
        rng.choice(FILLER).format(topic=rng.choice(TOPICS), adj=rng.choice(ADJ)) for _ in range(n_sentences)
    )


def generate_sample(n_records: int = 16, seed: int = 0, n_paragraphs: int = 8) -> list[dict]:
    """Generate ``n_records`` records ``{id, document, question, answer, reference}``.

    ``n_paragraphs`` counts the paragraphs of the document (about 55 words each): the lede (the key facts
    and the code name) at a random position in the first half, and ``n_paragraphs - 1`` distractors.
    """
    if n_records < 1 or n_paragraphs < 1:
        raise ValueError(f"n_records and n_paragraphs must be >= 1, got {n_records}, {n_paragraphs}")
    records = []
    for i in range(n_records):
        rng = random.Random(f"keyformer-sample-{seed}-{i}")
        facts, _ = _fact_sentences(rng)
        code = rng.choice(CODE_NAMES)
        lede = " ".join([facts[0], f"The project's code name is {code}.", *facts[1:]])
        paragraphs = [_distractor(rng) for _ in range(n_paragraphs - 1)]
        paragraphs.insert(rng.randint(0, (n_paragraphs - 1) // 2), lede)
        records.append({"id": f"sample-{seed}-{i:04d}", "document": "\n\n".join(paragraphs),
                        "question": QUESTION,
                        "answer": code, "reference": f"The code name of the project is {code}."})
    return records
