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


def is_held_out(prompt_index: int, held_out_every: int = 10) -> bool:
    """Every `held_out_every`-th prompt of a set is held out: training never sees it."""
    return prompt_index % held_out_every == held_out_every - 1


def split_prompts(prompts: list[str], held_out_every: int = 10) -> tuple[list[str], list[str]]:
    """(train, held_out) by is_held_out."""
    train = [p for i, p in enumerate(prompts) if not is_held_out(i, held_out_every)]
    held = [p for i, p in enumerate(prompts) if is_held_out(i, held_out_every)]
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
# The kind of each benchmark prompt, in order: the bench reports its speedups per kind.
BENCH_KINDS = ["chat"] * 6 + ["code"] * 6 + ["summary"] * 6 + ["list"] * 6
assert len(BENCH_KINDS) == len(BENCH_PROMPTS)


# ----------------------------------------------------------------------------- task prompts
# A second distillation set, built procedurally from the kinds of request the benchmark
# makes (everyday questions, small code tasks, summaries of a given text, list edits)
# so that the draft sees those shapes of answer. No benchmark prompt is in it (a test checks).

ASK_HOW = [
    "a microwave oven", "a bicycle gear", "a thermostat", "a camera", "a vacuum cleaner", "a battery",
    "a compass", "a washing machine", "an elevator", "a lock and key", "a smoke detector", "a jet engine",
    "a touch screen", "a light bulb", "a dishwasher", "a calculator", "a parachute", "a submarine",
    "a hot air balloon", "a wind turbine", "a telescope", "a car engine", "a rocket", "GPS",
    "Wi-Fi", "a credit card", "a search engine", "an air conditioner", "a toaster", "a piano",
]
ASK_WHY = [
    "Why is the ocean salty?", "Why is ice slippery?", "Why is grass green?", "Why can we see the Moon during the day?",
    "Why does bread go stale?", "Why is yawning contagious?", "Why are sunsets red?", "Why do onions make us cry?",
    "Why do leaves change color in autumn?", "Why do cats purr?", "Why is the sea level rising?",
    "Why does coffee keep us awake?", "Why does metal feel cold?", "Why do stars twinkle?", "Why is snow white?",
    "Why do we get hiccups?", "Why does music give us chills?", "Why is the Earth round?", "Why do birds migrate?",
    "Why does popcorn pop?",
]
ASK_TIPS = [
    "saving money", "cooking rice", "running a first 5k", "keeping plants alive", "writing a cover letter",
    "making friends in a new city", "studying for exams", "waking up early", "drinking more water",
    "staying calm before an interview", "organizing a small kitchen", "learning to draw", "traveling on a budget",
    "reducing screen time", "taking better photos with a phone", "keeping a journal", "working from home",
    "reading more books", "training a puppy", "planning a birthday party",
]
ASK_IDEAS = [
    "a summer afternoon", "a family dinner", "a school science project", "a birthday gift for a friend",
    "a short trip near home", "a quiet evening", "a picnic", "a club meeting", "a snowy day",
    "a team-building event", "a healthy breakfast", "a garden in a small space", "a long car ride",
    "a first date", "a free weekend in the city",
]
ASK_START = [
    "running", "baking bread", "painting with watercolors", "learning Spanish", "playing chess",
    "meditating", "coding in Python", "swimming", "knitting", "playing the piano", "writing poetry",
    "growing vegetables", "rock climbing", "photography", "yoga",
]
ASK_DIFF = [
    ("a frog", "a toad"), ("weather", "a season"), ("a lake", "a pond"), ("a comet", "an asteroid"),
    ("a crocodile", "an alligator"), ("baking soda", "baking powder"), ("a hurricane", "a tornado"),
    ("RAM", "storage"), ("a city", "a town"), ("a fruit", "a vegetable"), ("speed", "velocity"),
    ("a cold", "the flu"), ("a loan", "a grant"), ("a rabbit", "a hare"), ("a debit card", "a credit card"),
    ("a planet", "a star"), ("an ocean", "a sea"), ("a fact", "an opinion"), ("Python", "JavaScript"),
    ("a mountain", "a hill"),
]
CHAT_TEMPLATES = [
    ("How does {x} work?", ASK_HOW), ("Explain how {x} works.", ASK_HOW),
    ("{x}", ASK_WHY), ("{x} Explain it simply.", ASK_WHY),
    ("What are some tips for {x}?", ASK_TIPS), ("Give me three tips for {x}.", ASK_TIPS),
    ("Give me some ideas for {x}.", ASK_IDEAS), ("What can I do for {x}?", ASK_IDEAS),
    ("How do I start {x}?", ASK_START), ("I want to get into {x}. Where should I begin?", ASK_START),
]

CODE_TASKS = [
    "returns the product of the numbers in a list", "returns the odd numbers of a list",
    "counts how many times a letter appears in a string", "returns the longest word in a sentence",
    "checks whether a list is sorted", "returns the second largest number in a list",
    "converts a string to title case", "returns the average of a list of numbers",
    "removes all spaces from a string", "returns the index of the smallest item in a list",
    "checks whether a year is a leap year", "returns the common items of two lists",
    "returns the sum of the digits of an integer", "capitalizes every word in a sentence",
    "returns a list of the squares of a list of numbers", "counts the uppercase letters in a string",
    "checks whether a number is even", "returns the last n items of a list",
    "splits a list into chunks of size n", "returns the number of unique items in a list",
    "replaces every vowel in a string with a star", "returns the maximum of three numbers",
    "converts minutes to hours and minutes", "returns the first character of every word",
    "checks whether all the items of a list are positive", "rotates a list by k positions",
]
CODE_LANGS = ["Python function", "Python function", "JavaScript function", "Python function with a docstring"]

PLACES = ["The town of Millbrook", "A small school in the north", "The regional hospital", "A local football club",
          "The city library", "A family-run hotel", "The state railway company", "A group of volunteers",
          "The university's science department", "A popular coffee chain", "The national weather service",
          "A startup in the capital", "The village council", "A team of marine biologists", "The airport"]
EVENTS = ["announced a plan to cut its energy use by half", "opened a new building after two years of work",
          "started a program that teaches older people to use smartphones", "raised money to repair its roof",
          "reported a record number of visitors this summer", "switched to electric buses",
          "launched a free lunch scheme for students", "found an old shipwreck off the coast",
          "delayed its project because of rising costs", "planted ten thousand trees along the river",
          "began testing a four-day working week", "banned plastic bags in its shops"]
DETAILS = ["The work was paid for by a national grant.", "Most residents welcomed the news.",
           "Some critics say the plan is too expensive.", "Staff needed several weeks of training.",
           "The first results will be published in the spring.", "Similar schemes have worked well elsewhere.",
           "Local businesses helped with the costs.", "The change will take about three years.",
           "Children and teachers took part in the planning.", "It is the first project of its kind in the region."]
ENDINGS = ["Organizers hope others will follow.", "A public meeting is planned for next month.",
           "Officials will review the results at the end of the year.", "More details will be shared online.",
           "Visitors are welcome to come and see it.", "If it works, it may be made permanent."]
SUMMARY_TEMPLATES = ["Summarize this text: {x}", "Summarize this in one sentence: {x}",
                     "What is the main point of this text? {x}", "Write a short summary of the following: {x}"]

LIST_POOLS = [
    ["apple", "pear", "grape", "mango", "plum", "kiwi", "lemon", "peach", "melon", "orange", "lime", "fig"],
    ["lion", "tiger", "zebra", "horse", "eagle", "shark", "otter", "panda", "koala", "camel", "goat", "wolf"],
    ["red", "orange", "yellow", "green", "blue", "indigo", "violet", "pink", "brown", "gray", "black", "white"],
    ["Berlin", "Madrid", "Rome", "Oslo", "Vienna", "Dublin", "Athens", "Lisbon", "Prague", "Warsaw", "Seoul", "Delhi"],
    ["Anna", "Ben", "Carla", "David", "Emma", "Felix", "Grace", "Hugo", "Iris", "Jack", "Lena", "Omar"],
    ["pen", "notebook", "ruler", "eraser", "stapler", "scissors", "tape", "marker", "folder", "glue", "clip", "chalk"],
    ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October"],
]
LIST_OPS = [
    "Sort these words alphabetically: {x}.", "Reverse this list: {x}.", "Copy this list, one item per line: {x}.",
    "Number each item of this list: {x}.", "Remove the duplicates from this list: {x}.",
    "Put this list in reverse alphabetical order: {x}.", "Write each item of this list in capital letters: {x}.",
    "How many items are in this list? {x}.",
]
NUMBER_OPS = [
    "Sort these numbers from smallest to largest: {x}.", "Sort these numbers from largest to smallest: {x}.",
    "Reverse this list of numbers: {x}.", "Which of these numbers are even? {x}.",
    "Add up these numbers: {x}.", "What is the largest number in this list? {x}.",
]


def task_prompts(n_lists: int = 240, n_summaries: int = 240, seed: int = 0) -> list[str]:
    """The second distillation set (about 900 prompts), the same for a given seed."""
    import random
    rng = random.Random(seed)
    out = [tpl.format(x=x) for tpl, xs in CHAT_TEMPLATES for x in xs]
    out += [f"What is the difference between {a} and {b}?" for a, b in ASK_DIFF]
    out += [f"Write a {lang} that {task}." for task in CODE_TASKS for lang in CODE_LANGS[:2 + (len(task) % 3)]]
    for _ in range(n_summaries):
        text = " ".join([f"{rng.choice(PLACES)} {rng.choice(EVENTS)}.", *rng.sample(DETAILS, 2), rng.choice(ENDINGS)])
        out.append(rng.choice(SUMMARY_TEMPLATES).format(x=text))
    for i in range(n_lists):
        if i % 3 == 2:
            x = ", ".join(str(rng.randint(1, 60)) for _ in range(rng.randint(5, 9)))
            out.append(rng.choice(NUMBER_OPS).format(x=x))
            continue
        op = rng.choice(LIST_OPS)
        items = rng.sample(rng.choice(LIST_POOLS), rng.randint(4, 7))
        if "duplicates" in op:
            items += rng.sample(items, 2)
            rng.shuffle(items)
        out.append(op.format(x=", ".join(items)))
    rng.shuffle(out)
    return list(dict.fromkeys(out))


# ----------------------------------------------------------------------------- chat prompts
# A third distillation set: everyday questions only, the kind of prompt where the draft
# agreed least with the target in the benchmark. Built from subjects and question shapes
# that neither the benchmark nor task_prompts uses (a test checks the benchmark part).

CHAT_THINGS = [
    "a rainbow", "the tides", "a volcano", "an earthquake", "a thunderstorm", "the immune system", "the heart",
    "photosynthesis", "a vaccine", "the internet", "electricity", "a solar panel", "a bridge", "a dam",
    "the stock market", "inflation", "a recipe", "a printer", "a satellite", "a clock", "a fridge magnet",
    "a barcode", "an email", "a password", "a spreadsheet", "a map", "a cloud", "a river delta", "a desert",
    "a coral reef", "the water cycle", "recycling", "compost", "a library", "a museum", "a marathon",
    "a vegetable garden", "a beehive", "a newspaper", "a podcast",
]
CHAT_ACTIVITIES = [
    "cook pasta", "make a budget", "learn a new word every day", "stay focused while studying",
    "clean a messy room", "prepare for a job interview", "keep a houseplant healthy", "write a thank-you note",
    "plan a road trip", "start a morning routine", "save energy at home", "make a good cup of tea",
    "pack for a weekend trip", "get better at public speaking", "care for a new kitten", "set goals for the year",
    "fall asleep faster", "take notes in a lecture", "make a simple salad", "stretch after a run",
    "choose a good book", "organize a closet", "keep a conversation going", "learn to type faster",
    "make new habits stick", "spend less on groceries", "write a short story", "teach a child to ride a bike",
    "prepare a presentation", "stay warm in winter",
]
CHAT_THING_TEMPLATES = [
    "What is {x}?", "Tell me about {x}.", "Describe {x} in a few sentences.", "Explain {x} to a child.",
    "What are some interesting facts about {x}?", "Why is {x} important?",
]
CHAT_ACTIVITY_TEMPLATES = [
    "How can I {x}?", "What is the best way to {x}?", "Give me a few tips to {x}.",
    "What mistakes should I avoid when I {x}?", "Can you help me {x}?",
]


def chat_prompts(seed: int = 0) -> list[str]:
    """The third distillation set (390 everyday questions), the same for a given seed."""
    import random
    out = [tpl.format(x=x) for tpl in CHAT_THING_TEMPLATES for x in CHAT_THINGS]
    out += [tpl.format(x=x) for tpl in CHAT_ACTIVITY_TEMPLATES for x in CHAT_ACTIVITIES]
    random.Random(seed).shuffle(out)
    return list(dict.fromkeys(out))
