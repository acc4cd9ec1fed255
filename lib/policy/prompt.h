#pragma once
/// Prompt text of the DreamZero policy (dreamzero-reference.md §1.4, dreamzero_cotrain.py):
/// the embodiment's template (oxe_droid: the multi-view template) around the lower-cased instruction, the fixed negative prompt,
/// and the tokenizer's "whitespace" cleaning (ftfy.fix_text, html.unescape twice, strip, collapse
/// whitespace runs). All strings are UTF-8.
///
/// Known gaps (docs/SAMPLING.md): ftfy's mojibake repair and NFC normalization are not reproduced
/// (a subset of its fixes is); lower-casing covers ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic
/// and full-width Latin; html.unescape knows numeric references and a table of common named ones;
/// Python-literal prompts are unwrapped only for quoted strings and lists/tuples of them.
#include <string>
#include <string_view>

#include "config/embodiment.h"

namespace dzr {

/// The fixed negative prompt (dreamzero_cotrain.py:538), used as is (no template).
inline constexpr std::string_view kDroidNegativePrompt =
    "Vibrant colors, overexposed, static, blurry details, text, subtitles, style, artwork, painting, image, "
    "still, grayscale, dull, worst quality, low quality, JPEG artifacts, ugly, mutilated, extra fingers, bad "
    "hands, bad face, deformed, disfigured, mutated limbs, fused fingers, stagnant image, cluttered "
    "background, "
    "three legs, many people in the background, walking backwards.";

/// The oxe_droid template: "A multi-view video shows that a robot " + p + " The video is split into
/// three views: ... The robot " + p, with p = lower(instruction) (after unwrapping a Python literal,
/// as the reference's ast.literal_eval does). No punctuation is added around p.
std::string droid_prompt(std::string_view instruction);

/// The instruction in an embodiment's template (dreamzero_cotrain.py collate(); p = lower(instruction) after
/// the literal unwrapping, as for droid_prompt):
///   Droid            droid_prompt
///   FourViewsHands   "A multi-view video shows that a robot " + p + " The video is split into four views: The
///                    top-left view shows the camera view from the robot's head, the top-right view shows the
///                    camera view from the right hand, the bottom-left view shows the camera view from the left
///                    hand, and the bottom-right view is a black screen (inactive view). The robot " + p
///   FourViewsYam     "A multi-view video shows that a robot " + p + " The video is split into four views: The
///                    top-left view shows the top camera, the top-right view shows the right camera, the
///                    bottom-left view shows the left camera, and the bottom-right view is a black screen. The
///                    robot " + p
///   SingleViewHuman  "A single view video shows that a human " + p
std::string templated_prompt(PromptTemplate templ, std::string_view instruction);

/// The reference's `whitespace` cleaning before tokenization: ftfy subset, html.unescape twice,
/// strip, runs of whitespace -> one space, strip.
std::string clean_prompt_text(std::string_view text);

/// Python's html.unescape: numeric character references (with the HTML5 replacement rules) and
/// named references from a table of common entities (longest legacy prefix without ';' included).
std::string html_unescape(std::string_view text);

/// Lower-casing like Python's str.lower() for the scripts listed in the header comment; other
/// characters pass unchanged. Invalid UTF-8 bytes become U+FFFD.
std::string lower_utf8(std::string_view text);

/// The subset of ftfy.fix_text reproduced: terminal escapes removed, HTML entities unescaped when the
/// text has no '<', Latin ligatures split, full-width ASCII narrowed, curly quotes straightened,
/// line breaks unified, control characters and BOMs removed.
std::string ftfy_subset(std::string_view text);

/// ast.literal_eval unwrapping: a quoted string literal gives its value; a list or tuple gives its
/// first element (a string or an integer); anything else is returned unchanged.
std::string unwrap_python_literal(std::string_view text);

}  // namespace dzr
