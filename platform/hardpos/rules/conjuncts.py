"""Is a candidate caption the original with two whole coordinated phrases exchanged?

Contract: :func:`is_conjunct_swap` (pure, deterministic; :mod:`hardpos.rules.validate`
uses it for SWAP positives and to refuse meaning-keeping SWAP negatives). It searches every split ``P + X + S + Y + Q`` and accepts
only when X and Y pass the rules of :func:`_whole_conjuncts`; doubtful splits are rejected.
Token predicates and word classes come from :mod:`hardpos.rules.wordclasses`.
"""
from __future__ import annotations

from hardpos.rules.wordclasses import (
    AFTER_COORDINATION,
    ANAPHORS,
    BINDS_RIGHT,
    BINDS_RIGHT_ANIMATE,
    CLAUSE_PUNCT,
    COORDINATORS,
    DETERMINERS,
    FINITE,
    LOCATIVE,
    NUMERALS,
    OF_COLLECTIONS,
    POSSESSIVES,
    PREP_NOUNS,
    PREPOSITIONS,
    SEPARATORS,
    Classify,
    is_plural,
    word_classes,
)
from hardpos.rules.english import noun_number
from hardpos.rules.textnorm import fold_counted_plurals, tokens

#: articles one singular noun can share with a bare one after "and" ("a knife and fork")
SHARED_ARTICLES = frozenset({"a", "an", "the"})


def _swap_tokens(text: str) -> list[str]:
    return ["a" if t == "an" else t for t in tokens(text)]


def _separator_at(toks: list[str], k: int) -> int:
    """Length of the separator starting at ``k`` (0 when none)."""
    for sep in SEPARATORS:
        if tuple(toks[k:k + len(sep)]) == sep:
            return len(sep)
    return 0


def _runs_after(toks: list[str], a: int) -> list[tuple[int, list[tuple[int, int]], bool]]:
    """Where a later conjunct may start, given the left conjunct ends at ``a``.

    Returns (start, middle conjuncts skipped on the way, whether a coordinating word was
    crossed) for each start reachable over separators and whole middle conjuncts:
    "A, B and C" gives B (nothing skipped) and C (B skipped)."""
    out = []
    middles: list[tuple[int, int]] = []
    crossed = False
    t = a
    while True:
        n = _separator_at(toks, t)
        if not n:
            return out
        crossed = crossed or any(x in COORDINATORS for x in toks[t:t + n])
        t += n
        if t >= len(toks):
            return out
        out.append((t, list(middles), crossed))
        m = t
        while m < len(toks) and not _separator_at(toks, m) and toks[m] not in CLAUSE_PUNCT:
            m += 1
        if m == t:
            return out
        middles.append((t, m))
        t = m


def _comma_list_before(toks: list[str], i: int, cls: Classify) -> tuple[int, list[list[str]]]:
    """Walk back over the comma-list the conjunct starting at ``i`` ends: (the index of the
    token before the whole list, -1 at the caption's start; the members before ``i``, in order)."""
    members: list[list[str]] = []
    t = i - 1
    while t >= 0 and toks[t] == ",":
        m = t - 1
        while m >= 0 and toks[m] not in CLAUSE_PUNCT and toks[m] not in COORDINATORS and not cls.linker(toks[m]):
            m -= 1
        if m == t - 1:
            break
        members.insert(0, toks[m + 1:t])
        t = m
    return t, members


def _list_opener(toks: list[str], i: int, cls: Classify) -> int:
    """Index of the token before the whole list the conjunct starting at ``i`` belongs to
    (-1 at the caption's start): "with a hat, a scarf and a dog" -> the index of "with"."""
    return _comma_list_before(toks, i, cls)[0]


def _whole_conjuncts(toks: list[str], i: int, a: int, y0: int, j: int, middles: list[tuple[int, int]],
                     crossed: bool, cls: Classify) -> bool:
    """Are X = toks[i:a] and Y = toks[y0:j] whole, parallel conjuncts of one coordination?

    Each rule guards against one way a swap of *parts* moves a modifier to another thing (the
    tests name a real caption for each):

    * Shape: X, Y (and list members between them) are all adjectives, all verb phrases or
      all noun phrases, with no coordinator or clause punctuation inside; a noun phrase holds
      no finite verb ("a woman ... hold a knife" is a clause) and no second determiner after a
      noun ("a hand a cellphone" is two phrases).  Members skipped in a non-adjacent swap come
      from one comma list ("A, B, C and D") and hold no preposition.
    * A comma alone joins list members only: the list must go on to an "and"/"or"; and the
      member before a comma has X's shape ("a snowy, icy, [empty street]" lists adjectives).
    * Nothing starts right after another "and" (nested coordination: "a black and [white cat]
      and [dog]").
    * Adjectives share the noun after them ("a [black] and [white] cat") or are predicates
      after a verb ("is [black] and [white]"); never after a noun, where X may end a compound
      ("some toilet [paper] and [brown] tiles").
    * Y holds no word pointing back to X ("a woman and [her child]", "... and [putting a chair
      over it]"): in front of X it would lose what it points to; and (checked before these
      rules) no singular pronoun follows the coordination ("a toilet and a bathtub with a cat
      next to [it]") and no order word is in it or after it ("another", "a third", "the other").
    * Verb phrases follow their subject ("a man [wearing glasses] and [holding a bottle]"); one
      with an object ends the clause; two bare verbs share only a place ("sitting and standing
      on a bench"), not an object or complement ("smiling and taking a picture").
    * Noun phrases, left edge: the caption's start, clause punctuation or a preposition/verb;
      or a shared article before two known nouns ("a [dog] and [cat]"), never a shared number
      or attribute ("two [cats] and [dogs]", "cooked [noodles] and [broccoli]").
    * Noun phrases, right edge: the caption's end, clause punctuation, a coordinator, a floating
      "all"/"both"/"together", or a preposition/verb that may attach to the whole coordination;
      never a noun ("a [cane] and [a roller] bag") or a word that may belong to Y alone ("with",
      "wearing", "of", "that", "to", a participle with its preposition: "[a hydrant] and [a
      car] parked near ...", and "in" after a person or animal, unless "in front of").
    * Comma lists (:func:`_noun_list_ok`): no unknown adjective taken for a member ("a snowy,
      [empty street] and [a car]"), and no preposition but a place after the list ("bed,
      [mirror] and [window] to patio").
    * Attribute scope (:func:`_may_share_modifiers`): prenominal modifiers of one conjunct may
      cover a bare other one ("a white [hat] and [uniform]", "[noodle] and [vegetable dish]").
    * Modifiers after a head (:func:`_post_modifiers_ok`): Y's may cover both ("a man and [a
      woman on a motorcycle]"); the coordination may sit inside X's ("[a white plate containing
      fried food] and [various greens]"); and X with one forbids a preposition right after Y
      ("[a man with a hat] and [a woman] on a bench": Y stops early there).
    * Embedded coordination (after a preposition/verb that follows a noun: "a man with [a hat]
      and [a woman] ..."): Y may instead be the partner of that noun, so reject when the linker
      repeats after Y ("... with a dog"); when X and Y differ in animacy; when Y is a person or
      animal anywhere but after "of"; after "of" unless the noun is a collection or a picture
      ("a group of", "a photo of"; not "a body of water and mountains"); and when only one
      conjunct has a determiner, after "of" always, elsewhere unless the bare one is a known
      thing or the linker is a finite verb ("a kitchen has [a stove] and [microwave]"); and when
      the linker's noun is itself inside a prepositional phrase ("with a frame on [wall] and
      [sink]": the sink may be the frame's partner); and when the linker is a place ("on", "in",
      not "between") and both conjuncts, each with its own determiner, end the caption ("a
      truck on [a street] and [a traffic light]": the light may be the truck's partner).
    """
    common = cls.shapes(toks[i:a]) & cls.shapes(toks[y0:j]) - _points_back(toks[y0:j], cls)
    if middles:
        seps = [t for t in toks[a:y0] if t in COORDINATORS or t == ","]
        if any(t != "," for t in seps[:-1]) or any(cls.linker(t) for s, e in middles for t in toks[s:e]):
            return False
    for s, e in middles:
        common &= cls.shapes(toks[s:e])
    if not crossed:  # "A, B and C" swapping A and B: the list must carry on to its "and"
        rest = toks[j:]
        if not rest or rest[0] not in (",", "and", "or", "&") or not (COORDINATORS & set(rest)):
            return False
    if i > 0 and toks[i - 1] in COORDINATORS:
        return False
    if i > 0 and toks[i - 1] == ",":  # X continues a list: its previous member has X's shape
        m = i - 2
        while m >= 0 and toks[m] not in CLAUSE_PUNCT and toks[m] not in COORDINATORS and not cls.linker(toks[m]):
            m -= 1
        if m == i - 2:
            return False
        prev = toks[m + 1:i - 1]
        bare = [t for t in prev if t not in DETERMINERS] or prev  # "a blue, [white] and red": "a" is shared
        common &= cls.shapes(prev) | cls.shapes(bare)  # "a snowy, icy, [empty city street]" lists adjectives
    if "noun" in common:
        earlier = _earlier_members(toks, i, cls)
        if (earlier or middles) and not _noun_list_ok(
                [*earlier, toks[i:a], *(toks[s:e] for s, e in middles), toks[y0:j]], toks[j] if j < len(toks) else None,
                cls):
            common -= {"noun"}
    return any(_EDGE_RULES[shape](toks, i, a, y0, j, cls) for shape in sorted(common))


def _points_back(y: list[str], cls: Classify) -> frozenset[str]:
    """The shapes in which Y's pronouns may point back to X, so that Y cannot move in front of
    it: any pronoun in a noun phrase ("a woman and [her child]"); in a verb phrase an object
    pronoun ("sitting on a skateboard and [riding it]"), not a possessive of the subject
    ("kneeling by his skateboard and [holding up his arm]")."""
    if not any(t in ANAPHORS for t in y):
        return frozenset()
    nxt = [*y[1:], None]
    in_vp = any(t in ANAPHORS - POSSESSIVES and not (t == "her" and cls.content(n)) for t, n in zip(y, nxt))
    return frozenset({"noun", "adj", "vp"} if in_vp else {"noun", "adj"})


def _earlier_members(toks: list[str], i: int, cls: Classify) -> list[list[str]]:
    """The comma-list members before the conjunct starting at ``i``, in order ("a bathroom with
    [a sink], toilet and shower" -> [["a", "sink"]]); empty when no comma comes right before it."""
    return _comma_list_before(toks, i, cls)[1]


def _noun_list_ok(members: list[list[str]], right: str | None, cls: Classify) -> bool:
    """May these comma-list members ("A, B and C") be read as whole noun phrases of one list?

    * No adjective taken for a member. A word the lexicon does not know counts as a noun, so
      in "a snowy, empty street and a car" or "a dusty, muddy field and a horse" the first
      adjective looks like a member, and a swap across it moves a noun into the adjective list
      ("a snowy, a car and empty street"). Refused: a member that is one word (after an
      optional determiner) not known as a noun, before a bare member of several words (the
      shape of stacked adjectives before one noun). One-word members ("an apple, orange and
      onion") and members known as nouns ("a couch, table, book shelf and a television") stay.
    * The list ends at the caption's end, punctuation, a coordinator, a verb or a place ("on",
      "in", ...) after a bare last member ("an omelette, oranges, and tomatoes on a plate"); any
      other preposition, or a place after a last member with its own determiner, may belong to
      that member alone ("bed, mirror and window [to patio]", "five cups, a pineapple and some
      oranges [on a plate]"), so the swap would move it to another thing.
    """
    if right in PREPOSITIONS and (right not in LOCATIVE or members[-1][0] in DETERMINERS):
        return False  # "cups, a pineapple and some oranges [on a plate]": the place may be the last member's
    nouns = cls.wc.nouns
    for m, nxt in zip(members, members[1:]):
        head = [t for t in m if t not in DETERMINERS]
        if (len(head) == 1 and head[0] not in nouns and not is_plural(head[0]) and len(nxt) > 1
                and nxt[0] not in DETERMINERS):
            return False
    return True


#: what a "black and white" (monochrome) is said of
_MONOCHROME = frozenset({"photo", "photos", "picture", "pictures", "image", "images", "photograph", "photographs", "shot",
                         "film", "movie", "tv", "television", "print", "snapshot", "closeup", "view", "scene"})


def _adjectives_ok(toks: list[str], i: int, a: int, y0: int, j: int, cls: Classify) -> bool:
    left = toks[i - 1] if i > 0 else None
    right = toks[j] if j < len(toks) else None
    if left in cls.wc.nouns and left not in cls.wc.adjectives:
        return False  # "some toilet [paper] and [brown] tiles": X may end a compound noun
    if {toks[i], toks[y0]} == {"black", "white"} and a - i == 1 and j - y0 == 1 and right in _MONOCHROME:
        return False  # "a black and white photo" is monochrome, an idiom in this order
    if cls.content(right):
        return True  # a shared head noun ("a brown and gold fire hydrant")
    if (left in DETERMINERS or cls.content(left)) and cls.ing_verb(right or "") and cls.content(
            toks[j + 1] if j + 1 < len(toks) else None):
        return True  # "a black and white sitting room": prenominal, the head comes later
    return (cls.boundary(right) or right in COORDINATORS or cls.linker(right)) and cls.opens_at(toks, i)


def _verb_phrases_ok(toks: list[str], i: int, a: int, y0: int, j: int, cls: Classify) -> bool:
    left = toks[i - 1] if i > 0 else None
    right = toks[j] if j < len(toks) else None
    if left in DETERMINERS:
        return False
    if a - i == 1 and j - y0 == 1:
        return cls.boundary(right) or right in COORDINATORS or right in LOCATIVE
    if a - i == 1 and any(t in PREPOSITIONS for t in toks[y0:j]):
        return False  # "grazing and [eating in the pasture]": the place may cover both
    return cls.boundary(right) or right in COORDINATORS


def _noun_phrases_ok(toks: list[str], i: int, a: int, y0: int, j: int, cls: Classify) -> bool:
    wc = cls.wc
    x, y = toks[i:a], toks[y0:j]
    left = toks[i - 1] if i > 0 else None
    right = toks[j] if j < len(toks) else None
    x_det, y_det = x[0] in DETERMINERS, y[0] in DETERMINERS
    if not cls.opens_at(toks, i):  # X starts after an article it shares with Y
        if x_det or y_det or left in NUMERALS or left not in DETERMINERS:
            return False
        if x[-1] not in wc.nouns or y[-1] not in wc.nouns:
            return False  # "stand in a [field] and [graze]"
        if left == "a" and (is_plural(x[-1]) or is_plural(y[-1])):
            return False  # "a [bright window] and [house plants]": no article shared with a plural
    if x_det and len(x) == 2 and x[1] not in wc.nouns and not y_det and y[0] in wc.pure_adjectives:
        return False  # "a [grown] and [white dog]": two adjectives sharing "dog"
    if x[0] in SHARED_ARTICLES and not y_det and y[0] not in NUMERALS and noun_number(y[-1]) == "sg":
        return False  # "a [bride] and [groom]": one article for the pair; "groom and a bride" drops it
    if not (cls.boundary(right) or right in COORDINATORS or cls.linker(right) or right in AFTER_COORDINATION):
        return False
    if right in COORDINATORS and j + 1 < len(toks) and toks[j + 1] not in DETERMINERS:
        return False  # "two giraffes and [some green trees] and yellow flowers": "some green" may cover the flowers
    y_animate = y[-1] in wc.animate
    in_front = right == "in" and j + 1 < len(toks) and toks[j + 1] == "front"
    if right in BINDS_RIGHT or (right in BINDS_RIGHT_ANIMATE and y_animate and not in_front) or (
            cls.participle(right or "") and j + 1 < len(toks) and toks[j + 1] in PREPOSITIONS):
        return False
    if (right in PREPOSITIONS or cls.ing_verb(right or "")) and any(cls.linker(t) for t in x[1:]):
        return False  # "[a man with a hat] and [a woman] on a bench": Y may go on
    if not _post_modifiers_ok(x, y, cls):
        return False
    if _may_share_modifiers(x, y, cls) or _may_share_modifiers(y, x, cls):
        return False
    opener = _list_opener(toks, i, cls)
    if opener >= 0 and cls.linker(toks[opener]) and any(cls.content(t) for t in toks[:opener]):
        link = toks[opener]
        if right == link or (x[-1] in wc.animate) != y_animate:
            return False
        if y_animate and (link != "of" or any(t in wc.animate for t in toks[:opener])):
            return False
        if link == "of" and toks[opener - 1] not in OF_COLLECTIONS:
            return False
        if link in LOCATIVE and link not in _TAKES_PAIR and x_det and y_det and cls.boundary(right):
            return False  # "a truck on [a street] and [a traffic light]": the light may be the truck's partner
        if link in PREPOSITIONS and _nested_in_prepositional_phrase(toks, opener, cls):
            return False  # "with a coat on [his shoulder] and [a suitcase] by his foot"
        if x_det != y_det:
            bare = y if x_det else x
            if link == "of" or (link not in FINITE and (bare[-1] not in wc.nouns or bare[-1] in wc.animate)):
                return False  # "a bowl of [soup] and [a sandwich]", "in [a black dress] and [fans]"
    return True


def _nested_in_prepositional_phrase(toks: list[str], opener: int, cls: Classify) -> bool:
    """The noun before the preposition at ``opener`` is itself a preposition's object ("a bathroom
    with [a frame] on ..."): Y may then be that noun's partner ("with [a frame on wall] and [sink]")."""
    q = opener - 1
    while q >= 0 and (toks[q] in DETERMINERS or (cls.content(toks[q]) and toks[q] not in PREP_NOUNS)):
        q -= 1
    if q == opener - 1 or q < 1 or toks[q] not in PREPOSITIONS or toks[q] == "of":
        return False
    return any(cls.content(t) for t in toks[:q])


def _post_modifiers_ok(x: list[str], y: list[str], cls: Classify) -> bool:
    """Conjuncts with a modifier after their head ("a man [with a hat]").

    * Only Y has one: it may cover both ("a man and a woman [on a motorcycle]"); an "of"
      complement stays with its noun ("two toothbrushes and a tube [of toothpaste]").
    * Only X has one: the coordination may sit inside it ("a white plate containing [fried food
      and various greens]"); clear only when Y is the same kind of person/animal as X's head and
      X's inner noun is neither ("[a man with a hat] and [a woman]").
    * Both: the same linking words, and both heads people/animals ("[a man in a white shirt] and
      [a woman in a white dress]"); "[night scene with clock tower] and [buildings with lights]"
      is no such pair.
    """
    x_links = [k for k, t in enumerate(x) if k and cls.linker(t)]
    y_links = [k for k, t in enumerate(y) if k and cls.linker(t) and t != "of"]
    if not x_links and not y_links:
        return True
    if not x_links:
        return False
    animate = cls.wc.animate
    x_head = x[x_links[0] - 1]
    if not y_links:
        return y[-1] in animate and animate.get(x_head) == animate[y[-1]] and x[-1] not in animate
    y_head = y[y_links[0] - 1]
    return [x[k] for k in x_links] == [y[k] for k in y_links] and x_head in animate and y_head in animate


def _may_share_modifiers(first: list[str], second: list[str], cls: Classify) -> bool:
    """In "first and second", may first's prenominal modifiers also cover a bare second?

    "a white [hat] and [uniform]", "a tennis [racket] and [ball]", "a brown [couch] and [foot
    stool]"; and, with the conjuncts the other way round, "[noodle] and [vegetable dish]".
    Either order of such a pair changes which things the modifiers describe.
    """
    if second[0] in DETERMINERS or any(cls.linker(t) for t in first):
        return False
    mods = [t for t in first[:-1] if t not in DETERMINERS]
    if not mods:
        return False
    pure = cls.wc.pure_adjectives
    return len(second) == 1 or (any(t in pure for t in mods) and not any(t in pure for t in second))


#: places that name two things by nature ("between a train and a river"): the coordination is theirs
_TAKES_PAIR = frozenset({"between", "among", "amongst"})

_EDGE_RULES = {"adj": _adjectives_ok, "vp": _verb_phrases_ok, "noun": _noun_phrases_ok}


def is_conjunct_swap(original: str, candidate: str) -> bool:
    """True when ``candidate`` is ``original`` with two whole coordinated phrases exchanged.

    That is: for some split ``original = P + X + S + Y + Q`` the candidate reads
    ``P + Y + S + X + Q``, where S joins conjuncts ("and", "or", ",", ", and"; in a list
    "A, B and C" it may also hold the members between X and Y) and X, Y pass the rules of
    :func:`_whole_conjuncts`.  Comparison is on :func:`tokens` (case, whitespace and a final
    period ignored) with "an" folded to "a", so articles may follow the new order, and a
    plural "s" right after a count above one dropped, so number agreement may follow it too
    ("three giraffes and two antelope" -> "two antelopes and three giraffes").

    Accepted: "a cat and a dog" -> "a dog and a cat"; "a sink, toilet and shower" -> "a sink,
    shower and toilet"; "A black and white cat" -> "A white and black cat"; "a man wearing
    glasses and holding a bottle" -> "a man holding a bottle and wearing glasses"; "a man
    with a hat and a woman with a dog" -> "a woman with a dog and a man with a hat".

    Rejected (binding swaps, hard negatives): "Blue bathroom with white towels" -> "White
    bathroom with blue towels" (no coordination); "a man with a hat and a woman with a dog" ->
    "a man with a woman and a hat with a dog"; "a person with a cane and a roller bag" -> "a
    person with a roller and a cane bag"; "a train and phone booth" -> "a phone and train booth".
    Doubtful splits are rejected: a wrong reject costs coverage, a wrong accept teaches the
    model that a binding change keeps the meaning.
    """
    o, c = _swap_tokens(original), _swap_tokens(candidate)
    if _is_swap_of(o, c):
        return True
    fo, fc = fold_counted_plurals(o), fold_counted_plurals(c)
    return (fo, fc) != (o, c) and _is_swap_of(fo, fc)


def _is_swap_of(o: list[str], c: list[str]) -> bool:
    """:func:`is_conjunct_swap` on comparison tokens."""
    n = len(o)
    if len(c) != n or o == c:
        return False
    first = next(k for k in range(n) if o[k] != c[k])
    last = max(k for k in range(n) if o[k] != c[k]) + 1
    cls = Classify(word_classes())
    for a in range(1, n):
        if not _separator_at(o, a):
            continue
        for i in range(min(first, a - 1), -1, -1):  # X = o[i:a], longest last
            if o[i] in COORDINATORS or o[i] in CLAUSE_PUNCT:
                break
            for y0, middles, crossed in _runs_after(o, a):
                for j in range(max(last, y0 + 1), n + 1):
                    if o[j - 1] in COORDINATORS or o[j - 1] in CLAUSE_PUNCT:
                        break
                    if c[i:j] == o[y0:j] + o[a:y0] + o[i:a] and not _references_move(o, i, a, y0, j) and _whole_conjuncts(
                            o, i, a, y0, j, middles, crossed, cls):
                        return True
    return False


#: words that point back to a singular thing named before them: after a coordination, which
#: conjunct they mean may depend on the order ("a toilet and a bathtub with a cat next to [it]")
_SINGULAR_ANAPHORS = frozenset({"it", "its", "itself", "he", "him", "his", "himself", "she", "her", "hers", "herself"})
#: words whose sense depends on what was named before: "another", ordinals, "the other"; moved
#: in front of it, or left behind it, they lose it ("a man and another man", "two on a bicycle
#: and a third on a scooter")
_ORDER_WORDS = frozenset({"another", "other", "others", "first", "second", "third", "fourth", "fifth", "last", "latter",
                          "former", "same", "rest", "one", "ones", "remaining"})


def _references_move(o: list[str], i: int, a: int, y0: int, j: int) -> bool:
    """Does swapping X = ``o[i:a]`` and Y = ``o[y0:j]`` change what a word points back to? A
    singular pronoun after them when both are singular and no word before them could be its
    antecedent (either conjunct may be "it": "a toilet and a bathtub with a cat next to [it]"),
    or an order word ("another", "the other", "a third") in them or after them."""
    after = o[j:]
    both_singular = not is_plural(o[a - 1]) and not is_plural(o[j - 1])
    # "a bathroom has [a shower] and [toilet] in it": a noun before them is the likelier antecedent
    host = any(t.isalpha() and t not in DETERMINERS and t not in PREPOSITIONS and t not in ("there", "is", "are")
               for t in o[:i])
    wc = word_classes()
    nouns = o[a - 1] not in wc.pure_adjectives and o[j - 1] not in wc.pure_adjectives  # not "a red and black truck"
    animate = o[a - 1] in wc.animate or o[j - 1] in wc.animate
    fits = {t for t in after if t in _SINGULAR_ANAPHORS and (t not in ("it", "its", "itself")) == animate}
    order = [t for k, t in enumerate(o[i:], start=i) if t in _ORDER_WORDS and not (t == "other" and o[k - 1] == "each")]
    return bool(both_singular and nouns and not host and fits) or bool(order)