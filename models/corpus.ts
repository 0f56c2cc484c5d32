// Training text for the small byte-level BPE. Original prose written for this project:
// stories, explanations, dialogue, code-like snippets, numbers and a little non-ASCII text.

const STORY = `The lighthouse keeper woke before the gulls. She lit the small stove, filled the kettle
from the rain barrel, and watched the grey water turn silver as the sun climbed over the cliffs.
Every morning began the same way, and she liked it that way. The ships that passed the point did
not know her name, but they knew her light, and that was enough.

On the third day of the storm a boat came in that was not on any list. It was small and old, with
a red hull and a mast that leaned to one side. A boy stood at the wheel. He was soaked, tired, and
far too young to be out alone. "Is this the island with the library?" he asked, when she had pulled
him onto the dock. She laughed, because nobody had asked about the library in twenty years.

The library was one room at the top of the tower, under the lamp. There were maps of the coast,
books about birds and tides, a dictionary with a broken spine, and a shelf of notebooks filled with
the weather reports of every keeper who had lived there. The boy read all afternoon. When the wind
dropped he asked if he could stay until the spring, and she said yes before she had decided to.

They counted the ships together. They learned the names of the rocks. He repaired the clock in the
kitchen, which had been wrong for as long as she could remember, and she taught him how to trim the
wick so the flame burned clean and bright. In April a letter arrived for him. He read it twice,
folded it carefully, and put it in the notebook for that year, between the wind and the rain.
`;

const SCIENCE = `Water boils at a lower temperature on a mountain than at the sea, because the air
pressure is lower. At sea level the boiling point is about 100 degrees Celsius; at 3,000 meters it
is closer to 90 degrees. This is why pasta takes longer to cook at high altitude, and why some
recipes give separate instructions for cooks who live in the mountains.

Light travels at roughly 299,792 kilometers per second in a vacuum. Sunlight needs a little more
than eight minutes to reach the Earth, so when we look at the sun we see it as it was eight minutes
ago. The nearest star after the sun is more than four light years away. Astronomers measure these
distances with parallax: they observe a star from two sides of the Earth's orbit and measure how
much it appears to move against the distant background.

A neural network is a function with many adjustable numbers, called parameters or weights. During
training, the network makes a prediction, the prediction is compared with the correct answer, and
every weight is nudged in the direction that would have made the error smaller. Repeat this millions
of times and the network becomes surprisingly good at its task. A language model predicts the next
token of a text, one token at a time, and the text it generates is the result of many such
predictions chained together. The tokens are pieces of words: common words are single tokens, while
rare words are split into several smaller pieces.

Attention lets each position in a sequence look at the earlier positions and decide which of them
matter. Each token produces a query, a key and a value. The query is compared with every key, the
scores are turned into weights with a softmax, and the output is the weighted sum of the values.
Rotary position embeddings rotate the queries and keys by an angle that depends on the position,
so the score between two tokens depends on how far apart they are.
`;

const DIALOGUE = `"Where did you put the keys?"
"On the table by the door, where they always are."
"They're not there. I've looked twice."
"Then check your coat pocket. You wore the blue coat yesterday."
"Oh. Found them. Sorry!"
"Don't be sorry, be on time. The train leaves at 7:45 and it won't wait for us."
"What's the weather like in Zürich this week?"
"Cold, I think. Bring a scarf, and maybe the umbrella we'd bought in Paris."
"Can you help me with this question? I don't understand why the answer is 42."
"Sure. Let's go through it step by step. First, what do we know about the problem?"
"We know the total is 84 and there are two equal parts."
"Right, so each part is 84 / 2 = 42. That's all there is to it."
"Thank you! That makes much more sense now."
"You're welcome. Is there anything else you'd like to ask?"
`;

const RECIPE = `Simple bread (makes one loaf)
- 500 g flour
- 350 ml warm water
- 10 g salt
- 7 g dry yeast
1. Mix the yeast with the water and wait 5 minutes.
2. Add the flour and the salt, and knead for about 10 minutes until the dough is smooth.
3. Cover the bowl and let the dough rise for 1 to 2 hours, until it has doubled in size.
4. Shape the loaf, place it on a tray, and let it rest for another 30 minutes.
5. Bake at 220 °C for 35 to 40 minutes. The bread is done when it sounds hollow underneath.
Tip: a bowl of water in the oven makes the crust crisper. Don't cut the loaf while it's hot!
`;

const CODE = `function fibonacci(n: number): number {
  if (n < 2) return n;
  let a = 0, b = 1;
  for (let i = 2; i <= n; i++) {
    const next = a + b;
    a = b;
    b = next;
  }
  return b;
}

export class Queue<T> {
  private items: T[] = [];
  push(item: T): void { this.items.push(item); }
  pop(): T | undefined { return this.items.shift(); }
  get length(): number { return this.items.length; }
}

def mean(values):
    """Return the arithmetic mean of a list of numbers."""
    if not values:
        raise ValueError("mean() of an empty list")
    return sum(values) / len(values)

for i in range(10):
    print(f"{i:3d} {i * i:5d} {mean([i, i + 1]):.2f}")

int main(int argc, char **argv) {
    printf("hello, world\\n");
    return 0;
}

SELECT name, COUNT(*) AS total FROM orders WHERE created_at >= '2024-01-01' GROUP BY name ORDER BY total DESC;
{"id": 17, "name": "sensor-3", "values": [0.25, -1.5, 3.75], "active": true, "tags": null}
const url = "https://example.com/api/v1/items?page=2&limit=50";
if (x != null && y >= 0 || z === undefined) { result += x * (y - z) / 2; }
# comment: TODO fix the off-by-one error in the loop above
git commit -m "Fix the parser for empty input" && npm test
`;

const NUMBERS = `Table 3. Monthly rainfall (mm), 2019-2023
Month     2019   2020   2021   2022   2023
January   78.4   91.2   65.0   88.7   102.3
February  61.9   70.1   58.6   49.3   77.8
March     55.0   48.2   71.4   60.9   52.6
Total: 195.3 + 209.5 + 195.0 + 198.9 + 232.7 = 1031.4
The meeting is on 2024-03-15 at 14:30. Call +1 (555) 010-2345 or write to info@example.org.
Prices: $3.99, $12.50, €7.20, £4.75, ¥1200. Discount: 15% off orders over $100.
Version 2.10.3 was released on 12/05/2023; version 3.0.0-beta.1 followed in January.
1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584, 4181, 6765.
π ≈ 3.14159, e ≈ 2.71828, √2 ≈ 1.41421, and 1/3 = 0.333... (repeating).
`;

const WORLD = `She ordered a café au lait and a croissant at the little café near the station.
His naïve plan was to read every book in the library before the summer ended.
The résumé listed three jobs, two degrees, and a fondness for crème brûlée.
In Zürich and München the trams run on time; in São Paulo the traffic never sleeps.
日本語を少し勉強しています。東京はとても大きい都市です。
Привет, как дела? Ελληνικά γράμματα: α, β, γ, δ. مرحبا بالعالم. שלום.
Emoji in messages: 🙂 😀 🚀 🎉 ❤️ 👍 — and a flag: 🇫🇷.
Façade, jalapeño, señor, coöperate, Ångström, Øresund, Kraków, İstanbul.
`;

const ESSAY = `Good software is written twice: once to discover what the problem really is, and once
to solve it properly. The first version teaches you where the hard parts are. The second version
is shorter, clearer and faster, because you finally understand what you are building. Many teams
never write the second version, and they spend years maintaining the first.

Writing tests before changing code is like checking the map before turning off the main road. It
takes a few minutes, and it saves hours of driving in circles. A good test is small, fast and
honest: it fails when the behavior is wrong and passes when the behavior is right, and nothing
else. A flaky test is worse than no test, because it teaches people to ignore failures.

When you explain a system to someone new, start with the data. What comes in, what goes out, and
where is it stored? Once the data is clear, the code usually follows. Draw the boxes and arrows on
a whiteboard, then ask the newcomer to draw them again from memory. The parts they forget are the
parts that need better names.

The river was wide and slow in the summer. Children swam near the bridge, old men fished from the
bank, and in the evening the whole town walked along the water to watch the sun go down behind the
hills. Nobody remembered who had planted the row of trees along the path, but everyone agreed that
the town would not be the same without them. In the autumn the leaves turned yellow and red, and
the path became a river of color of its own.

Questions to consider: Which of these ideas is the most important? Why do you think so? Give an
example from your own experience, and explain what you would do differently next time. Answer in
complete sentences, and keep your answer under two hundred words.
`;

/** The whole training corpus (a few KB). */
export const CORPUS: string = [STORY, SCIENCE, DIALOGUE, RECIPE, CODE, NUMBERS, WORLD, ESSAY].join('\n');
