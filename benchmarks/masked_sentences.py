"""Natural sentences with one word masked, for measuring agreement between precisions.

A trained model's answers on real sentences are what a user sees; random word strings (sentences.py,
made for timing) give flat distributions whose top tokens swap on any rounding. Each sentence is
masked at several words spread along it, so the masks cover nouns, verbs, function words, the
start and the end. The same arguments give the same texts on every machine.
"""

from __future__ import annotations

SENTENCES = (
    "paris is the capital of france.",
    "the cat sat on the mat and watched the birds outside the window.",
    "she drank a cup of hot coffee before leaving for work.",
    "the children played football in the park after school.",
    "he opened the door and walked into the dark room.",
    "water boils at one hundred degrees at sea level.",
    "the doctor told him to get more sleep and drink less coffee.",
    "my brother bought a new car last week.",
    "the train to london leaves from platform four at nine o'clock.",
    "we went to the beach and swam in the sea all afternoon.",
    "the teacher asked the students to open their books.",
    "it was raining so we stayed at home and watched a movie.",
    "the president of the united states lives in the white house.",
    "she plays the piano every evening after dinner.",
    "the old man walked slowly down the street with his dog.",
    "they built a small house near the river.",
    "the sun rises in the east and sets in the west.",
    "i forgot my umbrella and got wet on the way home.",
    "the museum is closed on mondays.",
    "he wrote a long letter to his mother.",
    "the company announced that profits rose by ten percent this year.",
    "the baby was sleeping quietly in her bed.",
    "we need to buy bread, milk and eggs from the shop.",
    "the police arrested the man outside the bank.",
    "the book was so interesting that i read it in one night.",
    "the moon is much smaller than the earth.",
    "she wants to become a doctor when she grows up.",
    "the football match was cancelled because of the snow.",
    "the restaurant serves the best pizza in town.",
    "he lost his keys and could not get into the house.",
    "the river flows through the city to the sea.",
    "my grandmother was born in a small village in italy.",
    "the students must finish their homework before friday.",
    "a strong wind blew the leaves off the trees.",
    "the meeting will start at ten in the morning.",
    "she smiled and waved to her friends across the street.",
    "the scientists discovered a new species of fish in the ocean.",
    "he was too tired to cook, so he ordered a pizza.",
    "the library has thousands of books about history.",
    "the plane landed safely despite the heavy rain.",
    "we watched the sun go down over the mountains.",
    "the shop on the corner sells fresh fruit and vegetables.",
    "the king and queen lived in a large castle.",
    "they celebrated his birthday with a big cake.",
    "the phone rang in the middle of the night.",
    "she speaks three languages, english, french and german.",
    "the army marched through the city to the palace.",
    "the farmer grows wheat and corn on his land.",
    "he broke his leg while skiing in the mountains.",
    "the internet has changed the way people work.",
    "the church bells ring every sunday morning.",
    "the soldiers fought bravely during the war.",
    "she put the flowers in a vase on the table.",
    "the weather will be cold and cloudy tomorrow.",
    "the nurse gave the patient some medicine.",
    "my sister is two years older than me.",
    "the film won an award for the best music.",
    "he drives to work every day in his old red car.",
    "the government plans to build a new hospital.",
    "the dog barked loudly at the stranger.",
    "there are seven days in a week.",
    "the students listened carefully to the lecture.",
    "she found a gold ring on the beach.",
    "the bridge was destroyed during the storm.",
    "we had fish and chips for dinner.",
    "the singer performed in front of a large crowd.",
    "the computer stopped working and i lost all my files.",
    "he always reads the newspaper at breakfast.",
    "the garden is full of roses in the summer.",
    "the hotel room had a beautiful view of the lake.",
    "the boy climbed the tree to get his ball.",
    "many people travel abroad during the holidays.",
    "the judge sentenced him to five years in prison.",
    "the kitchen smelled of fresh bread.",
    "our team won the game in the last minute.",
    "the birds fly south for the winter.",
    "she painted the walls of her bedroom blue.",
    "the bus was late again this morning.",
    "the ship sailed across the atlantic ocean.",
    "he plays guitar in a rock band.",
    "the price of oil has risen sharply.",
    "the girl was reading a book under a tree.",
    "the mountains were covered with snow.",
    "the university was founded in the twelfth century.",
    "you should wash your hands before eating.",
    "the car would not start because the battery was dead.",
    "the horse ran across the green field.",
    "the war ended in nineteen forty five.",
    "she was born in london and grew up in new york.",
    "the waiter brought us the menu and a glass of water.",
    "the fire spread quickly through the old building.",
    "he is the tallest player on the team.",
    "the earth goes around the sun once a year.",
    "the students sat quietly in the classroom.",
    "the thief stole her bag and ran away.",
    "my father works as an engineer at a large company.",
)


def masked_texts(mask: str, per_sentence: int = 5) -> list[str]:
    """Each sentence with one word replaced by ``mask``, at ``per_sentence`` words spread along it.

    A word keeps the punctuation that follows it (``france.`` -> ``[MASK].``), as a user writes.
    """
    texts: list[str] = []
    for sentence in SENTENCES:
        words = sentence.split()
        count = min(per_sentence, len(words))
        # Evenly spread positions, first and last word included.
        positions = sorted({round(i * (len(words) - 1) / max(1, count - 1)) for i in range(count)})
        for position in positions:
            word = words[position]
            tail = word[len(word.rstrip(".,")) :]
            texts.append(" ".join([*words[:position], mask + tail, *words[position + 1 :]]))
    return texts
