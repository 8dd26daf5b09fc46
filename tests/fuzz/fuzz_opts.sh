# fuzz_opts.sh — the libFuzzer and sanitizer options every run of the
# harnesses uses (tests/fuzz/run.sh, bench/fuzz.sh); sourced.
#   -malloc_limit_mb  one allocation above 256 MiB is an allocation storm:
#                     no input of these sizes needs one (a crash report
#                     with the allocating stack)
#   -rss_limit_mb     and the process above 2 GiB
#   -timeout          one input running 10 s is a hang
#   -max_len          inputs up to 64 KiB (headers, configs, vocabularies)
FUZZ_OPTS=(-malloc_limit_mb=256 -rss_limit_mb=2048 -timeout=10 -max_len=65536 -print_final_stats=1)
# UBSan reports are crashes, with a stack; ASan stops at the first error.
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
