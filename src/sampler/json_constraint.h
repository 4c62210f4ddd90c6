/*
 * Constrained decoding of JSON (OpenAI's response_format json_object and json_schema): before
 * each draw, every id whose bytes cannot continue a valid document is masked out, so that
 * what is generated is JSON (of the schema) whatever the model would rather say.
 *
 *   tokenizer --sl_json_vocab_create--> byte trie over the vocabulary (read-only, shared)
 *   schema    --sl_json_constraint_create--> automaton over bytes: a stack of frames
 *             (object, array, string, number, literal), one per nesting level
 *   mask: the trie walked depth first with the automaton's state, a branch cut at the
 *         first byte it rejects; the ids at the nodes reached are the ones allowed
 *   accept: the drawn id's bytes fed to the automaton
 *
 * What a document may hold (the automaton's rules, so that every document it completes
 * parses with jansson and validates against the schema):
 *  - at most SL_JSON_MAX_WS whitespace bytes in a row between tokens of the grammar (the
 *    model cannot loop on spaces) and none after the document;
 *  - strings: valid UTF-8, escapes but no \u0000 and no \u surrogate (jansson refuses
 *    lone ones; a pair is not worth the state); numbers: at most 18 digits in the integer
 *    part (an int64 for jansson) and in the fraction, at most 2 in the exponent;
 *  - values of "any" JSON (json_object's, or a schema without a type) nest at most
 *    SL_JSON_MAX_NEST deep.
 *
 * Schemas (draft 2020-12 keywords, those below only; any other is an error naming it, never
 * ignored, except the annotations title, description, default, examples, $schema, $id,
 * $comment, deprecated, readOnly, writeOnly, and $defs/definitions, which constrain nothing):
 *  - type: a name or a list of names (object, array, string, number, integer, boolean,
 *    null); no type: any value (an object when properties are given, an array when items);
 *  - properties, required: properties are written in the schema's order; optional ones may
 *    be left out, required ones cannot; additionalProperties is false unless said otherwise,
 *    and may be true or a schema only for an object without properties (a map);
 *  - items (a schema or true), minItems, maxItems;
 *  - enum, const: scalars (string, number, boolean, null), written as jansson writes them.
 * An object nested deeper than SL_JSON_MAX_NEST levels in the schema is an error too.
 *
 * Library code: errors come back as an sl_status with the sl_error filled. A constraint is
 * used by one thread at a time; a vocab may be shared by several (read-only). All the scratch
 * a mask or accept needs is allocated at create: neither allocates.
 */
#ifndef SL_SAMPLER_JSON_CONSTRAINT_H
#define SL_SAMPLER_JSON_CONSTRAINT_H

#include "core/common.h"
#include "tokenizer/tokenizer.h"

#define SL_JSON_MAX_WS   8  /* whitespace bytes in a row (spaces, tabs, newlines) */
#define SL_JSON_MAX_NEST 32 /* nesting of objects and arrays */

/* Each id's bytes and a byte trie over them: built once per tokenizer, read-only after. */
typedef struct sl_json_vocab sl_json_vocab;

/* Special tokens (sl_tokenizer_is_special) and ids without bytes are left out: never allowed
 * (but the EOS ids given to sl_json_constraint_create, when the document is complete). */
sl_status sl_json_vocab_create(const sl_tokenizer *tok, sl_json_vocab **out, sl_error *err);
void sl_json_vocab_free(sl_json_vocab *v);

typedef struct sl_json_constraint sl_json_constraint;

/*
 * A constraint at the start of a document. schema: a JSON schema (read during the call only),
 * or NULL for any JSON object (json_object). eos[n_eos]: the ids that end a reply (EOS,
 * end-of-turn), allowed exactly when the document is complete. v may be NULL: then only
 * sl_json_constraint_feed works (tests, fuzzing); else v must outlive the constraint.
 * A schema that uses what is not supported is SL_ERR_UNSUPPORTED, one that is not valid
 * SL_ERR_ARG, the message naming the keyword and where it is ("schema.properties.a.type").
 */
sl_status sl_json_constraint_create(const sl_json_vocab *v, const struct json_t *schema,
                                    const int32_t *eos, int32_t n_eos, sl_json_constraint **out,
                                    sl_error *err);
void sl_json_constraint_free(sl_json_constraint *c);
/* Back to the start of a document. */
void sl_json_constraint_reset(sl_json_constraint *c);

/* Sets logits[id] = -INFINITY for every id in [0, n) that may not come next: ids whose bytes
 * cannot continue the document, EOS ids until it is complete, every other id once it is
 * (only EOS ids are left). Ids past the vocabulary are masked too. */
void sl_json_constraint_mask(sl_json_constraint *c, float *logits, int32_t n);
/* Advances past id: 0, or -1 when id is not allowed here (the state is left as it was). An
 * EOS id is accepted when the document is complete, and ends it. */
int sl_json_constraint_accept(sl_json_constraint *c, int32_t id);
/* Feeds bytes as if they were one token's: 0, or -1 (the state left as it was). */
int sl_json_constraint_feed(sl_json_constraint *c, const char *bytes, size_t n);
/* 1 when the document is complete (an EOS id may come; a number at the root may also go
 * on). */
int sl_json_constraint_done(const sl_json_constraint *c);

/* The same functions with the constraint as a void pointer: the generation loop's callbacks
 * (sl_gen_params.mask, .accept). */
void sl_json_constraint_mask_cb(void *c, float *logits, int32_t n);
void sl_json_constraint_accept_cb(void *c, int32_t id);

#endif /* SL_SAMPLER_JSON_CONSTRAINT_H */
