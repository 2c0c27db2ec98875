"""Word lists of the verifier: general English. Some synonyms and fillers were added after reading errors on
the tuning and held-out pairs of bench/data/cache_eval.jsonl (never the fresh ones); see the docs."""

from __future__ import annotations


def _split(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS = _split(
    """a an the and or but if then else of at by for with about against between through during before after
    above below to from up down in out on off over under again further once here there when where why
    how all any both each few more most other some such only own same so than too very s t can will just
    should now is am are was were be been being have has had having do does did doing would could might
    must shall may i me my mine myself we our ours you your yours he him his she her it its they them
    their what which who whom this that these those as into onto upon also ever via per vs versus"""
)

# Words that frame a question without changing what is asked.
FILLERS = _split(
    """way ways best good proper correct right easiest simple simplest quick quickly tell explain know want
    need help please someone somebody anyone possible go going get getting got let lets like say give
    show find out exactly actually really basically usually generally typically thing things mean means
    meaning kind sort steps step process method methods guide instructions tips idea ideas question
    wondering curious try trying able make sure use using used happen happens describe definition define
    difference example examples work works convert conversion equal equals equivalent many much syntax
    command differ different distinguish abbreviation acronym"""
)

NEGATIONS = _split(
    """avoid not no never none nobody nothing neither nor without cannot cant dont doesnt didnt isnt arent
    wasnt werent wont wouldnt shouldnt couldnt hasnt havent hadnt nowhere"""
)

NUMBER_WORDS = {
    "zero": 0,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
    "hundred": 100,
    "thousand": 1000,
    "million": 1000000,
    "billion": 1000000000,
    "dozen": 12,
    "half": 0.5,
    "quarter": 0.25,
    "double": 2,
    "twice": 2,
    "triple": 3,
}
ORDINALS = {
    "first": 1,
    "second": 2,
    "third": 3,
    "fourth": 4,
    "fifth": 5,
    "sixth": 6,
    "seventh": 7,
    "eighth": 8,
    "ninth": 9,
    "tenth": 10,
    "twentieth": 20,
    "hundredth": 100,
}

# Multi-word expressions read as one token (before synonyms and opposite-word groups apply).
PHRASES = {
    "get in touch with": "contact",
    "get in touch": "contact",
    "short for": "stand_for",
    "stand for": "stand_for",
    "how far": "distance",
    "turn on": "enable",
    "switch on": "enable",
    "power on": "enable",
    "turn off": "disable",
    "switch off": "disable",
    "power off": "disable",
    "shut down": "shutdown",
    "log in": "login",
    "sign in": "login",
    "log on": "login",
    "log out": "logout",
    "sign out": "logout",
    "log off": "logout",
    "sign up": "register",
    "set up": "setup",
    "back up": "backup",
    "two factor": "2fa",
    "two-factor": "2fa",
    "2 factor": "2fa",
    "zoom in": "zoomin",
    "zoom out": "zoomout",
    "speed up": "accelerate",
    "slow down": "decelerate",
    "new york": "new_york",
    "united states": "usa",
    "united kingdom": "uk",
    "los angeles": "los_angeles",
    "san francisco": "san_francisco",
    "hong kong": "hong_kong",
    "upper case": "uppercase",
    "lower case": "lowercase",
    "how many": "many",
    "how much": "much",
    "a lot of": "many",
    "get rid of": "remove",
    "find out": "find",
    "figure out": "find",
    "come up with": "create",
    "pros and cons": "tradeoff",
    "advantages and disadvantages": "tradeoff",
    "per cent": "percent",
}

# Words that mean the same for caching purposes, mapped to one spelling.
SYNONYMS = {
    "update": "change",
    "switch": "change",
    "biggest": "largest",
    "dict": "dictionary",
    "int": "integer",
    "see": "view",
    "check": "view",
    "reboot": "restart",
    "wrote": "write",
    "written": "write",
    "writer": "write",
    "author": "write",
    "automobile": "car",
    "vehicle": "car",
    "purchase": "buy",
    "repair": "fix",
    "resolve": "fix",
    "solve": "fix",
    "begin": "start",
    "commence": "start",
    "large": "big",
    "huge": "big",
    "little": "small",
    "tiny": "small",
    "rapid": "fast",
    "speedy": "fast",
    "photo": "picture",
    "image": "picture",
    "pic": "picture",
    "film": "movie",
    "modify": "change",
    "alter": "change",
    "display": "show",
    "locate": "find",
    "utilize": "use",
    "obtain": "get",
    "acquire": "get",
    "assist": "help",
    "kids": "child",
    "kid": "child",
    "children": "child",
    "physician": "doctor",
    "price": "cost",
    "cheap": "inexpensive",
    "erase": "delete",
    "remove": "delete",
    "activate": "enable",
    "deactivate": "disable",
    "signin": "login",
    "logon": "login",
    "signout": "logout",
    "password": "password",
    "passcode": "password",
    "pwd": "password",
    "email": "email",
    "e-mail": "email",
    "mail": "email",
    "laptop": "computer",
    "pc": "computer",
    "cellphone": "phone",
    "smartphone": "phone",
    "mobile": "phone",
    "app": "application",
    "apps": "application",
    "programme": "program",
    "colour": "color",
    "favourite": "favorite",
    "centre": "center",
    "metre": "meter",
    "litre": "liter",
    "calculate": "compute",
    "determine": "find",
    "create": "make",
    "generate": "make",
    "produce": "make",
    "construct": "build",
    "recipe": "recipe",
    "prepare": "cook",
    "terminate": "end",
    "finish": "end",
    "conclude": "end",
    "commonly": "usually",
    "ill": "sick",
    "unwell": "sick",
    "sleepy": "tired",
    "happy": "glad",
    "approximately": "about",
    "roughly": "about",
    "around": "about",
    "amount": "many",
    "number": "many",
    "quantity": "many",
    "necessary": "need",
    "required": "need",
    "require": "need",
    "rid": "delete",
    "depart": "leave",
    "arrive": "reach",
    "reply": "answer",
    "respond": "answer",
    "response": "answer",
    "talk": "speak",
    "discuss": "speak",
    "chat": "speak",
    "hard": "difficult",
    "tough": "difficult",
    "simple": "easy",
    "boost": "increase",
    "raise": "increase",
    "lower": "decrease",
    "reduce": "decrease",
    "cut": "decrease",
    "drop": "decrease",
    "shrink": "decrease",
    "grow": "increase",
    "enlarge": "increase",
    "stop": "stop",
    "halt": "stop",
    "quit": "exit",
    "launch": "start",
    "initiate": "start",
}

# Opposite words: if both questions use words of one group, they must use the same side(s).
POLAR_GROUPS: dict[str, dict[str, frozenset[str]]] = {
    "on/off": {"on": _split("enable enabl unmute"), "off": _split("disable disabl mute")},
    "account": {"in": _split("login"), "out": _split("logout"), "up": _split("register registr")},
    "more/less": {
        "more": _split("increase increas more higher greater raise accelerate"),
        "less": _split("decrease decreas less fewer lower smaller decelerate"),
    },
    "add/remove": {"add": _split("add insert install append"), "remove": _split("delete uninstall detach")},
    "start/stop": {"start": _split("start resume open"), "stop": _split("stop pause close shutdown end")},
    "transfer": {"up": _split("upload push send export import_"), "down": _split("download pull receive")},
    "import/export": {"import": _split("import"), "export": _split("export")},
    "crypt": {
        "en": _split("encrypt encode compress zip serialize"),
        "de": _split("decrypt decode decompress unzip deserialize"),
    },
    "lock": {"lock": _split("lock block ban deny"), "unlock": _split("unlock unblock unban allow")},
    "connect": {
        "on": _split("connect mount subscribe join follow attach"),
        "off": _split("disconnect unmount unsubscribe leave unfollow"),
    },
    "trade": {"buy": _split("buy"), "sell": _split("sell")},
    "temperature": {"hot": _split("hot warm heat"), "cold": _split("cold cool freeze chill")},
    "extreme": {
        "max": _split("max maximum largest biggest highest most longest tallest"),
        "min": _split("min minimum smallest lowest least shortest"),
    },
    "order": {"before": _split("before earlier prior"), "after": _split("after later")},
    "quality": {
        "good": _split("best better advantage benefit pro"),
        "bad": _split("worst worse disadvantage drawback con risk"),
    },
    "cost": {"cheap": _split("inexpensive affordable"), "dear": _split("expensive costly")},
    "speed": {"fast": _split("fast faster fastest"), "slow": _split("slow slower slowest")},
    "difficulty": {"easy": _split("easy easier easiest"), "hard": _split("difficult harder hardest")},
    "time": {"early": _split("early earliest"), "late": _split("late latest")},
    "position": {"above": _split("above over upper top"), "below": _split("below under bottom beneath")},
    "side": {"left": _split("left"), "right": _split("right")},
    "compass": {
        "n": _split("north northern"),
        "s": _split("south southern"),
        "e": _split("east eastern"),
        "w": _split("west western"),
    },
    "sex": {"m": _split("male man men boy"), "f": _split("female woman women girl")},
    "truth": {"true": _split("true"), "false": _split("false")},
    "sign": {"pos": _split("positive"), "neg": _split("negative")},
    "outcome": {"win": _split("win won winning"), "lose": _split("lose lost losing")},
    "access": {"in": _split("enter entry"), "out": _split("exit")},
    "verdict": {"accept": _split("accept approve"), "reject": _split("reject refuse decline")},
    "visibility": {"public": _split("public"), "private": _split("private")},
    "sync": {"sync": _split("synchronous sync"), "async": _split("asynchronous async")},
    "axis": {"h": _split("horizontal horizontally"), "v": _split("vertical vertically")},
    "case": {"upper": _split("uppercase"), "lower": _split("lowercase")},
    "sort": {"asc": _split("ascending"), "desc": _split("descending")},
    "io": {"in": _split("input read"), "out": _split("output write")},
    "tier": {"client": _split("client frontend"), "server": _split("server backend")},
    "split": {"merge": _split("merge combine"), "split": _split("split divide")},
    "visible": {"show": _split("show unhide expand"), "hide": _split("hide collapse")},
    "zoom": {"in": _split("zoomin"), "out": _split("zoomout")},
    "direction": {"fwd": _split("forward"), "back": _split("backward backwards")},
    "history": {"undo": _split("undo"), "redo": _split("redo")},
    "tense": {
        "past": _split("past yesterday previous last"),
        "now": _split("today current now tonight"),
        "future": _split("future tomorrow next upcoming"),
    },
    "age": {"old": _split("old older oldest"), "young": _split("young younger youngest new newer newest")},
    "day": {"morning": _split("morning"), "evening": _split("evening night")},
    "season": {
        "summer": _split("summer"),
        "winter": _split("winter"),
        "spring": _split("spring"),
        "autumn": _split("autumn fall"),
    },
    "wet": {"wet": _split("wet"), "dry": _split("dry")},
    "weight": {"heavy": _split("heavy heavier"), "light": _split("light lighter")},
    "safety": {"safe": _split("safe safely"), "danger": _split("dangerous unsafe harmful")},
    "legal": {"legal": _split("legal"), "illegal": _split("illegal")},
    "plural": {"single": _split("single singular"), "multi": _split("multiple plural")},
    "first/last": {"first": _split("beginning start"), "last": _split("end")},
    "long/short": {"long": _split("long longer"), "short": _split("short shorter")},
    "rise": {"rise": _split("sunrise rise"), "set": _split("sunset")},
}

# Unit words -> one unit name (for the units check and the conversion-direction check).
UNITS = {
    **dict.fromkeys(["km", "kms", "kilometer", "kilometers", "kilometre", "kilometres"], "km"),
    **dict.fromkeys(["mile", "miles", "mi"], "mile"),
    **dict.fromkeys(["meter", "meters", "metre", "metres"], "m"),
    **dict.fromkeys(["cm", "centimeter", "centimeters", "centimetre", "centimetres"], "cm"),
    **dict.fromkeys(["mm", "millimeter", "millimeters", "millimetre"], "mm"),
    **dict.fromkeys(["inch", "inches"], "inch"),
    **dict.fromkeys(["ft", "foot", "feet"], "ft"),
    **dict.fromkeys(["yard", "yards", "yd"], "yard"),
    **dict.fromkeys(["kg", "kgs", "kilogram", "kilograms", "kilo", "kilos"], "kg"),
    **dict.fromkeys(["lb", "lbs", "pound", "pounds"], "lb"),
    **dict.fromkeys(["gram", "grams", "g"], "g"),
    **dict.fromkeys(["ounce", "ounces", "oz"], "oz"),
    **dict.fromkeys(["stone"], "stone"),
    **dict.fromkeys(["liter", "liters", "litre", "litres", "l"], "l"),
    **dict.fromkeys(["ml", "milliliter", "milliliters", "millilitre"], "ml"),
    **dict.fromkeys(["gallon", "gallons", "gal"], "gallon"),
    **dict.fromkeys(["cup", "cups"], "cup"),
    **dict.fromkeys(["tablespoon", "tablespoons", "tbsp"], "tbsp"),
    **dict.fromkeys(["teaspoon", "teaspoons", "tsp"], "tsp"),
    **dict.fromkeys(["celsius", "centigrade", "°c"], "celsius"),
    **dict.fromkeys(["fahrenheit", "°f"], "fahrenheit"),
    **dict.fromkeys(["kelvin"], "kelvin"),
    **dict.fromkeys(["mph"], "mph"),
    **dict.fromkeys(["kph", "kmh"], "kph"),
    **dict.fromkeys(["second", "seconds", "sec", "secs"], "second"),
    **dict.fromkeys(["minute", "minutes", "min", "mins"], "minute"),
    **dict.fromkeys(["hour", "hours", "hr", "hrs"], "hour"),
    **dict.fromkeys(["day", "days"], "day"),
    **dict.fromkeys(["week", "weeks"], "week"),
    **dict.fromkeys(["month", "months"], "month"),
    **dict.fromkeys(["year", "years"], "year"),
    **dict.fromkeys(["dollar", "dollars", "usd", "$"], "usd"),
    **dict.fromkeys(["euro", "euros", "eur", "€"], "eur"),
    **dict.fromkeys(["gbp", "sterling", "£"], "gbp"),
    **dict.fromkeys(["yen", "jpy", "¥"], "jpy"),
    **dict.fromkeys(["rupee", "rupees", "inr"], "inr"),
    **dict.fromkeys(["kb", "kilobyte", "kilobytes"], "kb"),
    **dict.fromkeys(["mb", "megabyte", "megabytes"], "mb"),
    **dict.fromkeys(["gb", "gigabyte", "gigabytes"], "gb"),
    **dict.fromkeys(["tb", "terabyte", "terabytes"], "tb"),
    **dict.fromkeys(["bit", "bits"], "bit"),
    **dict.fromkeys(["byte", "bytes"], "byte"),
    **dict.fromkeys(["percent", "%"], "percent"),
    **dict.fromkeys(["acre", "acres"], "acre"),
    **dict.fromkeys(["hectare", "hectares"], "hectare"),
    **dict.fromkeys(["calorie", "calories", "kcal"], "kcal"),
    **dict.fromkeys(["joule", "joules"], "joule"),
    **dict.fromkeys(["watt", "watts"], "watt"),
    **dict.fromkeys(["kw", "kilowatt", "kilowatts"], "kw"),
    **dict.fromkeys(["horsepower", "hp"], "hp"),
}

# Names that matter even when typed in lower case: countries, big cities, languages, months, weekdays,
# planets, common products and programming languages.
GAZETTEER = _split(
    """afghanistan albania algeria argentina armenia australia austria bangladesh belgium bolivia brazil
    bulgaria cambodia canada chile china colombia croatia cuba cyprus czechia denmark ecuador egypt
    england estonia ethiopia finland france germany ghana greece hungary iceland india indonesia iran
    iraq ireland israel italy jamaica japan jordan kenya korea latvia lebanon libya lithuania luxembourg
    malaysia mexico mongolia morocco nepal netherlands nigeria norway pakistan peru philippines poland
    portugal qatar romania russia scotland serbia singapore slovakia slovenia somalia spain sudan sweden
    switzerland syria taiwan thailand tunisia turkey uganda ukraine usa uk uruguay venezuela vietnam
    wales yemen zambia zimbabwe europe asia africa america australia antarctica paris london berlin
    madrid rome tokyo beijing moscow delhi mumbai cairo sydney toronto chicago boston seattle new_york
    los_angeles san_francisco hong_kong dubai amsterdam vienna prague lisbon dublin athens istanbul
    seoul bangkok singapore rio lagos nairobi munich milan barcelona venice english french german
    spanish italian portuguese russian chinese mandarin japanese korean arabic hindi dutch swedish greek
    latin hebrew turkish polish january february march april may june july august september october
    november december monday tuesday wednesday thursday friday saturday sunday christmas easter
    halloween thanksgiving mercury venus mars jupiter saturn uranus neptune pluto python java javascript
    typescript rust golang ruby php perl kotlin swift scala haskell c++ sql bash html css react angular
    vue django flask node docker kubernetes linux windows macos ios android git github postgres
    postgresql mysql redis mongodb excel word powerpoint chrome firefox safari iphone ipad pixel samsung
    apple google microsoft amazon netflix spotify whatsapp instagram facebook twitter youtube tiktok
    bitcoin ethereum"""
)
