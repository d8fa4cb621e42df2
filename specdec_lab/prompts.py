"""Prompt sets the project writes itself: one to distill the draft, one to benchmark.

The distillation set is built from instruction templates crossed with topics, plus
hand-written code, rewriting, list and story prompts, so that the draft sees the
kinds of text the target writes in the lab. A fixed tenth is held out: training
never sees it, and every acceptance figure is measured on it.
"""

TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "vaccines", "compound interest",
    "the French Revolution", "plate tectonics", "machine learning", "the immune system",
    "climate change", "the internet", "electric cars", "the Roman Empire", "volcanoes",
    "the human heart", "inflation", "solar panels", "DNA", "the Moon landing", "recycling",
    "sleep", "coffee", "honeybees", "the stock market", "earthquakes", "rainbows",
    "the printing press", "antibiotics", "gravity", "the Great Wall of China",
    "renewable energy", "democracy", "the brain", "ocean tides", "password security",
    "healthy eating", "time management", "learning a new language", "public speaking",
    "the theory of evolution", "electricity", "airplanes", "the seasons", "bread baking",
    "meditation", "the periodic table", "cloud computing", "friendship", "chess",
    "the Olympic Games", "deserts", "rain forests", "the speed of light", "money",
]

TEMPLATES = [
    "Explain {t} to a ten-year-old.",
    "What is {t}? Answer in three sentences.",
    "Give me five interesting facts about {t}.",
    "Write a short paragraph about {t}.",
    "List the pros and cons of {t}.",
    "Why does {t} matter? Explain briefly.",
    "Write a haiku about {t}.",
    "Summarize the main ideas of {t} in bullet points.",
    "Write a short story that involves {t}.",
    "What are common misconceptions about {t}?",
    "Describe {t} as if you were a teacher starting a lesson.",
    "Write three quiz questions about {t}, with answers.",
]

CODE_PROMPTS = [
    "Write a Python function that reverses a string.",
    "Write a Python function to check whether a number is prime.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python function that counts the vowels in a string.",
    "Write a Python function that merges two sorted lists.",
    "Write a Python class for a simple bank account with deposit and withdraw.",
    "Write a Python function that removes duplicates from a list while keeping order.",
    "Write a Python function that computes the factorial of n recursively.",
    "Write a JavaScript function that sums an array of numbers.",
    "Write a SQL query that selects all users older than 30 from a table named users.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a bash command that counts the lines in every .txt file in a folder.",
    "Write a Python function that finds the largest number in a list without using max.",
    "Write a Python function that converts Celsius to Fahrenheit.",
    "Write a Python script that reads a CSV file and prints the first five rows.",
    "Write a Python function that sorts a list of dictionaries by the key 'age'.",
    "Explain what a for loop does in Python, with an example.",
    "Write a Python function that flattens a nested list.",
    "Write a Python function that returns the word frequencies of a text as a dict.",
    "Write a C function that swaps two integers using pointers.",
    "Explain the difference between a list and a tuple in Python.",
    "Write a Python function for binary search on a sorted list.",
    "Write an HTML page with a heading and a button.",
    "Write a Python generator that yields the squares of the numbers 1 to n.",
]

REWRITE_TEXTS = [
    "The meeting has been moved to Thursday because the room was double booked.",
    "Our new app helps people track their daily water intake and sends reminders.",
    "The library will close early on Friday for staff training and reopen on Saturday.",
    "Scientists discovered a new species of frog in the mountains of Peru last year.",
    "The train was delayed by forty minutes due to a signal failure near the station.",
    "Regular exercise improves mood, sleep quality and overall health.",
    "The company reported higher profits this quarter thanks to strong online sales.",
    "Please remember to bring your own water bottle and sunscreen to the picnic.",
]

REWRITE_TEMPLATES = [
    "Rewrite this sentence in a more formal tone: {x}",
    "Summarize in a few words: {x}",
    "Translate this sentence into simple English for a child: {x}",
    "Turn this into a short, friendly email: {x}",
    "Fix the grammar and make this more concise: {x}",
]

LISTS = [
    "apple, banana, cherry, date, elderberry",
    "3, 17, 8, 42, 1, 23",
    "red, green, blue, yellow, purple",
    "Paris, London, Tokyo, Cairo, Lima",
    "dog, cat, horse, rabbit, parrot",
    "12, 5, 9, 30, 2, 14, 7",
]

LIST_TEMPLATES = [
    "Sort this list alphabetically or from smallest to largest: {x}",
    "Reverse the order of this list: {x}",
    "Repeat this list, numbering each item: {x}",
    "Copy this list exactly, one item per line: {x}",
]

EXTRA = [
    "Tell me a joke about computers.",
    "How do I make a cup of tea?",
    "What should I pack for a weekend camping trip?",
    "Give me tips for staying focused while studying.",
    "Write a poem about autumn leaves.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Plan a simple three-day workout routine for a beginner.",
    "Write a thank-you note to a teacher.",
    "How can I save money on groceries?",
    "Describe a sunset over the ocean.",
    "What are the planets in our solar system?",
    "Write a dialogue between a robot and a cat.",
    "Give me a recipe for pancakes.",
    "Write a short fairy tale about a brave mouse.",
    "How do airplanes stay in the air?",
    "What is the difference between weather and climate?",
]


def distill_prompts() -> list[str]:
    """All distillation prompts, in a fixed order (about 800)."""
    out = [tpl.format(t=t) for t in TOPICS for tpl in TEMPLATES]
    out += CODE_PROMPTS + EXTRA
    out += [tpl.format(x=x) for x in REWRITE_TEXTS for tpl in REWRITE_TEMPLATES]
    out += [tpl.format(x=x) for x in LISTS for tpl in LIST_TEMPLATES]
    return out


def split_prompts(prompts: list[str], held_out_every: int = 10) -> tuple[list[str], list[str]]:
    """(train, held_out): every `held_out_every`-th prompt is held out."""
    train = [p for i, p in enumerate(prompts) if i % held_out_every != held_out_every - 1]
    held = [p for i, p in enumerate(prompts) if i % held_out_every == held_out_every - 1]
    return train, held


# A fixed benchmark set: chat, code, summarising a given text, and list manipulation.
BENCH_PROMPTS = [
    "Why is the sky blue?",
    "What are three tips for better sleep?",
    "Explain how a refrigerator works.",
    "What is the difference between a virus and a bacterium?",
    "Give me some ideas for a rainy weekend.",
    "How do I start learning to play the guitar?",
    "Write a Python function that returns the sum of the even numbers in a list.",
    "Write a Python function that checks whether two strings are anagrams.",
    "Write a Python function that counts the words in a sentence.",
    "Write a Python class for a stack with push, pop and peek.",
    "Write a Python function that returns the reverse of a list.",
    "Write a JavaScript function that capitalizes the first letter of a string.",
    "Summarize this text: The city council voted to build a new park near the river. "
    "The park will have a playground, walking paths and a small lake. Work begins next spring.",
    "Summarize this text: Bees pollinate many of the crops we eat. Their numbers have fallen "
    "because of pesticides, disease and habitat loss, and farmers are worried.",
    "Summarize this text: The museum opened a new exhibit about ancient Egypt. It includes "
    "mummies, jewelry and tools, and it will stay open until the end of the year.",
    "Summarize this text: Remote work has grown quickly. Many workers enjoy the flexibility, "
    "but some miss the social side of the office and find it hard to switch off.",
    "Summarize this text: A new study found that people who walk for thirty minutes a day "
    "sleep better and report less stress than those who do not exercise.",
    "Summarize this text: The bakery on Main Street is famous for its sourdough. It opens at "
    "six every morning, and there is often a line before the doors open.",
    "Sort these numbers from smallest to largest: 9, 2, 31, 14, 6, 27, 3.",
    "Reverse this list: one, two, three, four, five, six.",
    "Copy this list, one item per line: milk, eggs, bread, butter, cheese, apples.",
    "Number each item of this list: Monday, Tuesday, Wednesday, Thursday, Friday.",
    "Sort these words alphabetically: zebra, mango, apple, kiwi, banana, lemon.",
    "Remove the duplicates from this list: cat, dog, cat, bird, dog, fish, bird.",
]
