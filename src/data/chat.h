/* chat.h — instruction and chat examples: a JSON line rendered with a chat
 * template into token ids and a loss mask (prepare-data --template;
 * docs/data.md, "Instruction and chat data").
 *
 * An example is a JSON object, either
 *   {"prompt": "...", "completion": "..."}   (a user turn, then the
 *                                             assistant's), or
 *   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}.
 * A template gives each role a prefix and a suffix (and the user turn that
 * follows a system turn a prefix of its own: Llama 2 folds the system text
 * into the first [INST]), and a string before the first message (bos).
 * Every piece is tokenized on its own, in order: template strings with
 * their special tokens (a "<...>" the tokenizer has as a special id becomes
 * that id, otherwise it is text), message contents as plain text (a
 * special token's spelling inside a message stays text).  The mask is 1 on
 * the tokens the model learns: an assistant turn's content and suffix (the
 * end marker that teaches it to stop), and the example's closing EOT when
 * the last turn is the assistant's; 0 on everything else. */
#ifndef TRD_DATA_CHAT_H
#define TRD_DATA_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

struct cJSON;
struct Tokenizer;

enum { CHAT_SYSTEM, CHAT_USER, CHAT_ASSISTANT, CHAT_ROLES };

typedef struct {
    int defined; /* a template may leave a role out: a turn of it is an error */
    char *prefix, *suffix;
    char *prefix_after_system; /* user: the prefix right after a system turn (or NULL) */
} ChatRole;

typedef struct {
    char name[CFG_STR];
    char *bos;
    ChatRole role[CHAT_ROLES];
} ChatTemplate;

/* The built-in templates' names, for messages. */
extern const char chat_template_names[];

/* A built-in template by name (plain, chatml, llama2, llama3) or a JSON
 * file (a name ending in .json; docs/data.md gives its keys).  0, or -1
 * with err (unknown name, unreadable or malformed file, unknown key). */
int chat_template_load(ChatTemplate *t, const char *name, char err[CFG_ERR]);
void chat_template_free(ChatTemplate *t);

/* Token ids with their mask, grown together. */
typedef struct {
    int32_t *ids;
    uint8_t *mask;
    size_t n, cap, mask_cap;
} ChatTokens;

/* Render one example (a parsed JSON object) onto x (emptied first), EOT
 * last.  0; -1 with err saying what is wrong with the example (no
 * "messages" nor "prompt"/"completion", a message without a role or with an
 * unknown one, a role the template lacks, an empty completion or assistant
 * turn, no assistant turn, content not a string); -2 when out of memory. */
int chat_render(const ChatTemplate *t, struct Tokenizer *tok, const struct cJSON *example,
                ChatTokens *x, char err[CFG_ERR]);
void chat_tokens_free(ChatTokens *x);

/* The "<|...|>" markers of the template's strings that the tokenizer has no
 * special id for (they are encoded as text: GPT-2 has none of ChatML's),
 * comma-separated into out (empty when none). */
void chat_template_unmapped(const ChatTemplate *t, const struct Tokenizer *tok, char *out,
                            size_t n);

#endif
