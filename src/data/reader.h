/* reader.h — prepare-data's input files as byte streams (internal to
 * src/data): plain, gzip (.gz, through zlib) or zstd (.zst, through
 * libzstd), chosen by the file name's last extension.  Reading is
 * streaming: a fixed buffer of compressed and of decompressed bytes, plus
 * for reader_line a line buffer as long as the longest line, so memory
 * does not grow with the file.
 *
 * A corrupt or truncated compressed stream is an error (-1 and a message
 * without the file name, which the caller adds with the line), never a
 * silently shorter document.  Concatenated gzip members and zstd frames
 * (pigz, bgzip, zstd -T) are read one after the other, as gzip -d and
 * zstd -d do. */
#ifndef TRD_DATA_READER_H
#define TRD_DATA_READER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/error.h"

typedef enum { READER_PLAIN = 0, READER_GZIP, READER_ZSTD } ReaderCodec;

typedef struct DataReader DataReader;

/* The codec of a path: .gz gzip, .zst zstd, else plain ("-" is plain). */
ReaderCodec reader_codec(const char *path);

/* Open path ("-": stdin, plain).  NULL with err ("cannot open ...") on failure. */
DataReader *reader_open(const char *path, char err[TRD_ERR]);
void reader_close(DataReader *r);

/* Bytes [start, end) of a plain file as a stream (a part of a JSON lines
 * file that prepare-data splits over ranks).  NULL with err on failure, or
 * when path is compressed or stdin. */
DataReader *reader_open_range(const char *path, uint64_t start, uint64_t end, char err[TRD_ERR]);

/* Where the first line that starts at or after byte `at` of a plain file of
 * `size` bytes starts (size when none does): the cut between two parts, so
 * that a line straddling byte `at` stays whole in the earlier part.  0, or
 * -1 with err. */
int reader_line_start(const char *path, uint64_t at, uint64_t size, uint64_t *start,
                      char err[TRD_ERR]);

/* The lines that end before byte `end` of a plain file (its '\n's): the
 * line number a part starting there counts from.  0, or -1 with err. */
int reader_count_lines(const char *path, uint64_t end, uint64_t *lines, char err[TRD_ERR]);

/* Up to n decompressed bytes: the count, 0 at the end, -1 with err. */
ssize_t reader_read(DataReader *r, void *buf, size_t n, char err[TRD_ERR]);

/* The whole (rest of the) stream in a malloc'd buffer (NUL-terminated;
 * the terminator is not counted in *len).  NULL with err on failure. */
char *reader_slurp(DataReader *r, size_t *len, char err[TRD_ERR]);

/* The next line, without its '\n', in a buffer of the reader valid until
 * the next call: 1, 0 at the end, -1 with err.  A last line without '\n'
 * is returned too. */
int reader_line(DataReader *r, const char **line, size_t *len, char err[TRD_ERR]);

/* File bytes (compressed, as on disk) consumed so far: for progress. */
uint64_t reader_file_bytes(const DataReader *r);

#endif
