"""The bAbI world behind tasks.babi_sample: a tiny simulation of people, places and objects that writes the
ten bAbI families' stories (our own words) and asks each one question about the final state. A reader of
the paper can skip it: tasks.py hides these stories in filler and scores the answers."""
import numpy as np

from plumbing.files import require

# A story: event dicts (sentence in "text"); meta["asked"] names the question: tests re-derive its answer
BABI_PEOPLE = ("Alice", "Bruno", "Chloe", "Dmitri", "Elena", "Farid")
BABI_PLACES = ("kitchen", "garden", "hallway", "bedroom", "office", "cellar", "attic", "library")
BABI_OBJECTS = ("apple", "ball", "milk", "key", "book", "lamp")
BABI_DIRECTIONS = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}
BABI_NUMBERS = ("none", "one", "two", "three", "four", "five", "six")
BABI_TEMPLATES = {   # event kind -> its sentences (one is drawn)
    "move": ("{person} went to the {place}.", "{person} walked into the {place}.",
             "{person} headed for the {place}.", "{person} ran to the {place}."),
    "grab": ("{person} picked up the {obj}.", "{person} took the {obj}.", "{person} got the {obj}."),
    "drop": ("{person} put down the {obj}.", "{person} dropped the {obj}.",
             "{person} left the {obj} behind."),
    "give": ("{person} gave the {obj} to {other}.", "{person} handed the {obj} to {other}.",
             "{person} passed the {obj} to {other}."),
    "not_in": ("{person} is not in the {place}.", "{person} is no longer in the {place}."),
    "either": ("{person} is either in the {place} or the {place2}.",),
    "relation": ("The {place} is {direction} of the {place2}.",)}
BABI_QUESTIONS = {   # asked["kind"] -> the question, filled from `asked`
    "where_person": "Where is {person}?", "where_object": "Where is the {obj}?",
    "where_before": "Where was the {obj} before the {place}?", "is_in": "Is {person} in the {place}?",
    "what_is_dir_of": "What is {direction} of the {place}?", "who_gave": "Who gave the {obj} to {other}?",
    "what_is_x_dir_of": "What is the {place} {direction} of?", "who_received": "Who received the {obj}?",
    "count_carried": "How many objects is {person} carrying?", "list_carried": "What is {person} carrying?",
    "what_given": "What did {person} give to {other}?", "given_to": "Who did {person} give the {obj} to?"}
BABI_GIVE_ASKS = {   # qa5's question kinds: (what the question names, what it asks)
    "who_gave": (("obj", "other"), "person"), "what_given": (("person", "other"), "obj"),
    "given_to": (("person", "obj"), "other"), "who_received": (("obj",), "other")}
BABI_TASKS = {   # task -> event kinds (repeats weight them), events in [lo, hi), people, places, objects
    "qa1": ("move", (4, 9), 3, 5, 0), "qa2": ("move move grab drop", (6, 11), 3, 4, 3),
    "qa3": ("move move grab drop", (8, 15), 2, 4, 2), "qa4": ("relation", (2, 4), 0, 0, 0),
    "qa5": ("move move grab grab give give drop", (8, 14), 3, 3, 3),
    "qa6": ("move move move grab drop", (4, 9), 3, 4, 2),
    "qa7": ("move move grab grab drop give", (6, 12), 3, 3, 4),
    "qa8": ("move move grab grab drop give", (6, 12), 3, 3, 4),
    "qa9": ("move move not_in", (4, 9), 3, 4, 0), "qa10": ("move move either", (4, 9), 3, 4, 0)}
MAX_CARRIED = 3

def _simulate(rng, kinds, n_events, sizes):
    """A random valid story: to pick up or give, a person must be somewhere known; a lying object is picked
    up only where it lies; give needs both people in one place; nobody carries more than MAX_CARRIED."""
    n_people, n_places, n_objects = sizes
    people = rng.choice(BABI_PEOPLE, n_people, replace=False).tolist()
    places = rng.choice(BABI_PLACES, n_places, replace=False).tolist()
    objects = rng.choice(BABI_OBJECTS, n_objects, replace=False).tolist()
    loc = dict.fromkeys(people)   # None: unknown
    holder = dict.fromkeys(objects)
    lies_at = dict.fromkeys(objects)
    history = {o: [] for o in objects}   # each object's places
    events = []
    while len(events) < n_events:
        kind = pick(rng, kinds)
        free = [p for p in people if list(holder.values()).count(p) < MAX_CARRIED]   # can carry one more
        elsewhere = [dict(person=p, place=x) for p in people for x in places if x != loc[p]]
        event = pick(rng, {"move": elsewhere, "not_in": elsewhere,
                            "grab": [dict(person=p, obj=o) for p in free for o in objects
                                     if loc[p] and holder[o] is None and lies_at[o] in (None, loc[p])],
                            "drop": [dict(person=holder[o], obj=o) for o in objects if holder[o] is not None],
                            "give": [dict(person=holder[o], obj=o, other=q) for o in objects for q in free
                                     if holder[o] not in (None, q) and loc[q] == loc[holder[o]]],
                            "either": [dict(person=p, place=a, place2=b) for p in people for a in places
                                       for b in places if a != b]}[kind])
        if event is None:
            continue
        event = dict(kind=kind, **event)
        p = event["person"]
        o = event.get("obj")
        if kind == "give":
            holder[o] = event["other"]
        elif o:   # grab, drop: a dropped object lies where it was dropped
            if kind == "grab":
                holder[o] = p
                lies_at[o] = None
            else:
                holder[o] = None
                lies_at[o] = loc[p]
            history[o] = history[o] or [loc[p]]   # where it was first picked up
        else:     # move (what p carries goes along); "not in" and "either" leave the place unknown
            loc[p] = event["place"] if kind == "move" else None
            history.update({x: h + [loc[p]] for x, h in history.items() if holder[x] == p and loc[p]})
        events.append(dict(event, text=pick(rng, BABI_TEMPLATES[kind]).format(**event)))
    return events, dict(loc=loc, holder=holder, lies_at=lies_at, history=history, people=people,
                        places=places, objects=objects)

def _relations(rng, n_places):   # qa4's story (and no world): places on a grid, each next to a placed one
    places = rng.choice(BABI_PLACES, n_places, replace=False).tolist()
    cell = {places[0]: (0, 0)}
    events = []
    for new in places[1:]:
        old, d = pick(rng, [(old, d) for old in cell for d, (dx, dy) in BABI_DIRECTIONS.items()
                             if (cell[old][0] + dx, cell[old][1] + dy) not in cell.values()])
        cell[new] = (cell[old][0] + BABI_DIRECTIONS[d][0], cell[old][1] + BABI_DIRECTIONS[d][1])
        e = dict(kind="relation", place=new, direction=d, place2=old)
        events.append(dict(e, text=BABI_TEMPLATES["relation"][0].format(**e)))
    return [events[i] for i in rng.permutation(len(events))], {}

def _ask(task, rng, events, w):
    """-> (answer, asked) about the story's final state, or None: this story has no good question."""
    if task == "qa4":   # two argument relations: "What is north of the B?" -> A
        e = pick(rng, events)
        if rng.random() < 0.5:
            return e["place"], dict(kind="what_is_dir_of", direction=e["direction"], place=e["place2"])
        return e["place2"], dict(kind="what_is_x_dir_of", place=e["place"], direction=e["direction"])
    loc = w["loc"]
    holder = w["holder"]
    objects = w["objects"]
    h = w["history"]
    known = [p for p in w["people"] if loc[p]]
    if task == "qa1":   # single supporting fact
        return pick(rng, [(loc[p], dict(kind="where_person", person=p)) for p in known])
    if task == "qa2":   # two supporting facts
        place = {o: loc[holder[o]] if holder[o] else w["lies_at"][o] for o in objects}
        return pick(rng, [(place[o], dict(kind="where_object", obj=o)) for o in objects if place[o]])
    if task == "qa3":   # three supporting facts; "before the X" is clear if it was in X once, not first
        return pick(rng, [(h[o][i - 1], dict(kind="where_before", obj=o, place=x)) for o in objects
                           for i, x in enumerate(h[o]) if i and h[o].count(x) == 1])
    if task == "qa5":   # three argument relations; only questions with one answer
        gives = [e for e in events if e["kind"] == "give"]
        return pick(rng, [(g[asked], dict(kind=kind, **{k: g[k] for k in named})) for g in gives
                           for kind, (named, asked) in BABI_GIVE_ASKS.items()
                           if len({e[asked] for e in gives if all(e[k] == g[k] for k in named)}) == 1])
    if task == "qa6":   # yes/no questions
        p = pick(rng, known)
        place = loc[p] if rng.random() < 0.5 else pick(rng, [x for x in w["places"] if x != loc[p]])
        return "yes" if place == loc[p] else "no", dict(kind="is_in", person=p, place=place)
    if task in ("qa7", "qa8"):   # counting; lists/sets, sorted by name
        carrying = [p for p in known if p in holder.values()]
        p = pick(rng, carrying if carrying and rng.random() < 0.5 else known)   # fewer "none" answers
        held = sorted(o for o in objects if holder[o] == p)
        answer = BABI_NUMBERS[len(held)] if task == "qa7" else ",".join(held) or "nothing"
        return answer, dict(kind="count_carried" if task == "qa7" else "list_carried", person=p)
    last_fact = {e["person"]: e for e in events}   # qa9: "not in" facts; qa10: "either" facts
    last = last_fact[pick(rng, [p for p in w["people"] if p in last_fact])]
    named = [last[k] for k in ("place", "place2") if k in last]   # place2: an "either" fact's
    others = [x for x in w["places"] if x not in named]
    if task == "qa10":
        place = pick(rng, named) if rng.random() < 0.5 else pick(rng, others)
        answer = "no" if place not in named else ("yes" if last["kind"] == "move" else "maybe")
    else:   # a "not in" fact answers only about its place; after a move, 3/4 "yes" balances their "no"
        place = last["place"] if last["kind"] == "not_in" or rng.random() < 0.75 else pick(rng, others)
        answer = "yes" if last["kind"] == "move" and place == last["place"] else "no"
    return answer, dict(kind="is_in", person=last["person"], place=place)

def babi_story(task, seed=0):
    """-> (events, question, answer, asked) of a bAbI task ("qa1".."qa10"), from the seed."""
    require(task in BABI_TASKS, f"unknown bAbI task {task!r}: use one of {', '.join(BABI_TASKS)}")
    kinds, n_events, *sizes = BABI_TASKS[task]
    rng = np.random.default_rng(seed)
    qa = None
    while not qa:   # a story without a good question: draw another from the same rng
        n = int(rng.integers(*n_events))
        events, world = _relations(rng, n + 1) if task == "qa4" else _simulate(rng, kinds.split(), n, sizes)
        qa = _ask(task, rng, events, world)
    return events, BABI_QUESTIONS[qa[1]["kind"]].format(**qa[1]), *qa

def pick(rng, items):
    """One of items drawn by rng, or None if there are none."""
    return items[rng.integers(len(items))] if items else None
