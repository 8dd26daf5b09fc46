/* chat.c — chat templates and the rendering of examples (chat.h). */
#include "data/chat.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "data/prepare.h"
#include "data/tokenizer.h"

const char chat_template_names[] = "plain, chatml, llama2, llama3 or a FILE.json";

static const char *const role_names[CHAT_ROLES] = {"system", "user", "assistant"};

/* A built-in template: bos, then prefix and suffix per role (system, user,
 * assistant), then the user prefix after a system turn (NULL: the usual). */
typedef struct {
    const char *name, *bos;
    const char *pre[CHAT_ROLES], *suf[CHAT_ROLES];
    const char *user_after_system;
} Builtin;

static const Builtin builtins[] = {
    /* No markers: the prompt and the completion back to back. */
    {"plain", "", {"", "", ""}, {"", "", ""}, NULL},
    /* OpenAI's ChatML (Qwen, many fine-tunes). */
    {"chatml",
     "",
     {"<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n"},
     {"<|im_end|>\n", "<|im_end|>\n", "<|im_end|>\n"},
     NULL},
    /* Llama 2 chat: <s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST] A </s><s>[INST] U [/INST] A </s> */
    {"llama2",
     "",
     {"<s>[INST] <<SYS>>\n", "<s>[INST] ", " "},
     {"\n<</SYS>>\n\n", " [/INST]", " </s>"},
     ""},
    /* Llama 3 chat. */
    {"llama3",
     "<|begin_of_text|>",
     {"<|start_header_id|>system<|end_header_id|>\n\n",
      "<|start_header_id|>user<|end_header_id|>\n\n",
      "<|start_header_id|>assistant<|end_header_id|>\n\n"},
     {"<|eot_id|>", "<|eot_id|>", "<|eot_id|>"},
     NULL},
};

static char *dup_str(const char *s)
{
    char *d = trd_malloc(strlen(s) + 1, "a chat template");
    return strcpy(d, s);
}

static char *dup_or_null(const char *s) { return s ? dup_str(s) : NULL; }

void chat_template_free(ChatTemplate *t)
{
    free(t->bos);
    for (int r = 0; r < CHAT_ROLES; r++) {
        free(t->role[r].prefix);
        free(t->role[r].suffix);
        free(t->role[r].prefix_after_system);
    }
    memset(t, 0, sizeof *t);
}

/* A string member of a template file's object, or "" when absent; -1 for
 * another type. */
static int file_string(const cJSON *o, const char *key, const char *where, char **dst,
                       char err[CFG_ERR])
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (v && !cJSON_IsString(v))
        return trd_errorf(err, "%s: \"%s\" must be a string", where, key);
    if (dst)
        *dst = dup_str(v ? v->valuestring : "");
    return 0;
}

/* A template file: {"bos": S, "system"|"user"|"assistant": {"prefix": S,
 * "suffix": S, "prefix_after_system": S (user only)}}, every key optional
 * but at least the assistant's role; other keys are errors. */
static int load_file(ChatTemplate *t, const char *path, char err[CFG_ERR])
{
    if (access(path, R_OK) != 0)
        return trd_errorf(err, "cannot read the chat template %s: %s", path, strerror(errno));
    size_t len;
    char *text = data_read_input(path, &len);
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    int rc = 0;
    if (!j || !cJSON_IsObject(j)) {
        rc = trd_errorf(err, "chat template %s: not a JSON object%s", path,
                        j ? "" : " (malformed JSON)");
        goto done;
    }
    for (const cJSON *k = j->child; k && !rc; k = k->next) {
        int r = -1;
        for (int i = 0; i < CHAT_ROLES; i++)
            if (!strcmp(k->string, role_names[i]))
                r = i;
        if (!strcmp(k->string, "bos")) {
            rc = file_string(j, "bos", path, &t->bos, err);
            continue;
        }
        if (r < 0) {
            rc = trd_errorf(err,
                            "chat template %s: unknown key \"%s\" (bos, system, user, assistant)",
                            path, k->string);
            break;
        }
        if (!cJSON_IsObject(k)) {
            rc = trd_errorf(err, "chat template %s: \"%s\" must be an object of strings", path,
                            k->string);
            break;
        }
        for (const cJSON *f = k->child; f && !rc; f = f->next)
            if (strcmp(f->string, "prefix") && strcmp(f->string, "suffix") &&
                (r != CHAT_USER || strcmp(f->string, "prefix_after_system")))
                rc = trd_errorf(
                    err, "chat template %s: unknown key \"%s\" in \"%s\" (prefix, suffix%s)", path,
                    f->string, k->string, r == CHAT_USER ? ", prefix_after_system" : "");
        char where[CFG_STR + 32];
        snprintf(where, sizeof where, "chat template %s, \"%s\"", path, k->string);
        ChatRole *role = &t->role[r];
        role->defined = 1;
        if (!rc)
            rc = file_string(k, "prefix", where, &role->prefix, err);
        if (!rc)
            rc = file_string(k, "suffix", where, &role->suffix, err);
        if (!rc && cJSON_GetObjectItemCaseSensitive(k, "prefix_after_system"))
            rc = file_string(k, "prefix_after_system", where, &role->prefix_after_system, err);
    }
    if (!rc && !t->role[CHAT_ASSISTANT].defined)
        rc = trd_errorf(err, "chat template %s: no \"assistant\" role: nothing would be trained",
                        path);
done:
    cJSON_Delete(j);
    return rc;
}

int chat_template_load(ChatTemplate *t, const char *name, char err[CFG_ERR])
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    size_t n = strlen(name);
    if (n > 5 && !strcmp(name + n - 5, ".json")) {
        if (load_file(t, name, err) == 0) {
            if (!t->bos)
                t->bos = dup_str("");
            return 0;
        }
        chat_template_free(t);
        return -1;
    }
    for (size_t b = 0; b < sizeof builtins / sizeof *builtins; b++) {
        const Builtin *B = &builtins[b];
        if (strcmp(B->name, name))
            continue;
        t->bos = dup_or_null(B->bos);
        for (int r = 0; r < CHAT_ROLES; r++) {
            t->role[r].defined = 1;
            t->role[r].prefix = dup_or_null(B->pre[r]);
            t->role[r].suffix = dup_or_null(B->suf[r]);
        }
        t->role[CHAT_USER].prefix_after_system = dup_or_null(B->user_after_system);
        return 0;
    }
    return trd_errorf(err, "unknown chat template '%s' (%s)", name, chat_template_names);
}

void chat_tokens_free(ChatTokens *x)
{
    free(x->ids);
    free(x->mask);
    memset(x, 0, sizeof *x);
}

/* The mask of the ids appended since `from`: m.  -1 when out of memory. */
static int mark(ChatTokens *x, size_t from, uint8_t m)
{
    if (x->n == from) /* nothing appended (an empty piece): mask may still be NULL */
        return 0;
    if (x->n > x->mask_cap) {
        size_t c = x->cap > x->n ? x->cap : x->n;
        uint8_t *p = realloc(x->mask, c);
        if (!p)
            return -1;
        x->mask = p;
        x->mask_cap = c;
    }
    memset(x->mask + from, m, x->n - from);
    return 0;
}

static int push_id(ChatTokens *x, int32_t id, uint8_t m)
{
    if (x->n == x->cap) {
        size_t c = x->cap ? 2 * x->cap : 256;
        int32_t *p = realloc(x->ids, c * sizeof *p);
        if (!p)
            return -1;
        x->ids = p;
        x->cap = c;
    }
    x->ids[x->n++] = id;
    return mark(x, x->n - 1, m);
}

static int encode(struct Tokenizer *tok, const char *s, size_t len, ChatTokens *x, uint8_t m)
{
    size_t from = x->n;
    if (len && tokenizer_encode(tok, s, len, &x->ids, &x->n, &x->cap) != 0)
        return -1;
    return mark(x, from, m);
}

/* The length of the "<...>" at s (up to 64 bytes, no '<' inside), or 0. */
static size_t marker_len(const char *s)
{
    if (*s != '<')
        return 0;
    for (size_t i = 1; i < 64 && s[i] && s[i] != '<'; i++)
        if (s[i] == '>')
            return i + 1;
    return 0;
}

/* A template string: its special tokens as their ids, the text between
 * them encoded. */
static int encode_template(struct Tokenizer *tok, const char *s, ChatTokens *x, uint8_t m)
{
    if (!s)
        return 0;
    const char *text = s;
    for (const char *p = s; *p; p++) {
        size_t k = marker_len(p);
        int id = k ? tokenizer_special(tok, p, k) : -1;
        if (id < 0)
            continue;
        if (encode(tok, text, (size_t)(p - text), x, m) != 0 || push_id(x, id, m) != 0)
            return -1;
        p += k - 1;
        text = p + 1;
    }
    return encode(tok, text, strlen(text), x, m);
}

void chat_template_unmapped(const ChatTemplate *t, const struct Tokenizer *tok, char *out, size_t n)
{
    const char *strs[1 + 3 * CHAT_ROLES] = {t->bos};
    int k = 1;
    for (int r = 0; r < CHAT_ROLES; r++) {
        strs[k++] = t->role[r].prefix;
        strs[k++] = t->role[r].suffix;
        strs[k++] = t->role[r].prefix_after_system;
    }
    out[0] = '\0';
    for (int i = 0; i < k; i++)
        for (const char *p = strs[i]; p && *p; p++) {
            size_t len = marker_len(p);
            int looks = len > 4 && p[1] == '|' && p[len - 2] == '|';
            looks |= (len == 3 && !strncmp(p, "<s>", 3)) || (len == 4 && !strncmp(p, "</s>", 4));
            if (!looks || tokenizer_special(tok, p, len) >= 0)
                continue;
            char m[80];
            snprintf(m, sizeof m, "%.*s", (int)len, p);
            if (strstr(out, m))
                continue;
            size_t used = strlen(out);
            snprintf(out + used, n - used, "%s%s", used ? ", " : "", m);
        }
}

/* One turn: prefix, content, suffix; the assistant's content and suffix
 * trained. */
static int render_turn(const ChatTemplate *t, struct Tokenizer *tok, int role, int after_system,
                       const char *content, ChatTokens *x)
{
    const ChatRole *R = &t->role[role];
    const uint8_t m = role == CHAT_ASSISTANT;
    const char *prefix =
        after_system && R->prefix_after_system ? R->prefix_after_system : R->prefix;
    if (encode_template(tok, prefix, x, 0) != 0 ||
        encode(tok, content, strlen(content), x, m) != 0 ||
        encode_template(tok, R->suffix, x, m) != 0)
        return -2;
    return 0;
}

/* A string member, or NULL with err. */
static const char *member_string(const cJSON *o, const char *key, const char *what,
                                 char err[CFG_ERR])
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) {
        trd_errorf(err, "%s has no \"%s\"", what, key);
        return NULL;
    }
    if (!cJSON_IsString(v) || !v->valuestring) {
        trd_errorf(err, "%s: \"%s\" is not a string", what, key);
        return NULL;
    }
    return v->valuestring;
}

static int role_of(const char *name)
{
    for (int r = 0; r < CHAT_ROLES; r++)
        if (!strcmp(name, role_names[r]))
            return r;
    return -1;
}

int chat_render(const ChatTemplate *t, struct Tokenizer *tok, const cJSON *ex, ChatTokens *x,
                char err[CFG_ERR])
{
    x->n = 0;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(ex, "messages");
    const int pair = !msgs && (cJSON_GetObjectItemCaseSensitive(ex, "completion") ||
                               cJSON_GetObjectItemCaseSensitive(ex, "prompt"));
    if (!msgs && !pair)
        return trd_errorf(err, "neither \"messages\" (a chat) nor \"prompt\" and \"completion\"");
    if (msgs && (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs)))
        return trd_errorf(err, "\"messages\" must be a non-empty array of {\"role\", \"content\"}");
    if (encode_template(tok, t->bos, x, 0) != 0)
        return -2;
    int last = -1, n_assistant = 0;
    if (pair) {
        const char *prompt = member_string(ex, "prompt", "the example", err);
        const char *completion =
            prompt ? member_string(ex, "completion", "the example", err) : NULL;
        if (!completion)
            return -1;
        if (!*completion)
            return trd_errorf(err, "empty completion: nothing to train on");
        const int rc[2] = {render_turn(t, tok, CHAT_USER, 0, prompt, x),
                           render_turn(t, tok, CHAT_ASSISTANT, 0, completion, x)};
        if (rc[0] || rc[1])
            return -2;
        last = CHAT_ASSISTANT;
        n_assistant = 1;
    }
    int i = 0;
    for (const cJSON *m = msgs ? msgs->child : NULL; m; m = m->next, i++) {
        char what[64];
        snprintf(what, sizeof what, "message %d", i);
        if (!cJSON_IsObject(m))
            return trd_errorf(err, "%s is not an object {\"role\", \"content\"}", what);
        const cJSON *rv = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!rv)
            return trd_errorf(err, "%s has no \"role\"", what);
        if (!cJSON_IsString(rv) || !rv->valuestring)
            return trd_errorf(err, "%s: \"role\" is not a string", what);
        const int role = role_of(rv->valuestring);
        if (role < 0)
            return trd_errorf(err, "%s: unknown role \"%.40s\" (system, user or assistant)", what,
                              rv->valuestring);
        if (!t->role[role].defined)
            return trd_errorf(err, "%s: the chat template %s has no \"%s\" role", what, t->name,
                              role_names[role]);
        if (role == CHAT_SYSTEM && i > 0)
            return trd_errorf(err, "%s: a system message must come first", what);
        const char *content = member_string(m, "content", what, err);
        if (!content)
            return -1;
        if (role == CHAT_ASSISTANT && !*content)
            return trd_errorf(err, "%s: empty assistant message: nothing to train on", what);
        if (render_turn(t, tok, role, last == CHAT_SYSTEM, content, x) != 0)
            return -2;
        n_assistant += role == CHAT_ASSISTANT;
        last = role;
    }
    if (!n_assistant)
        return trd_errorf(err, "no assistant message: nothing to train on");
    /* EOT ends every example; trained when the assistant spoke last. */
    if (push_id(x, tokenizer_eot(tok), last == CHAT_ASSISTANT) != 0)
        return -2;
    return 0;
}
