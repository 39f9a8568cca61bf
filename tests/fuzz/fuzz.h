/* SPDX-License-Identifier: MIT */
/*
 * The libFuzzer entry points every target in tests/fuzz/ defines. In a
 * `-Dfuzz=true` clang build libFuzzer's own main drives them; in every other
 * build replay.c's main runs them over the seed corpus and the committed
 * reproducers, so each target is also a plain test (suite 'fuzz').
 *
 * A target aborts (assert) when the code under test breaks a promise it
 * makes about an input it accepted; sanitizers catch the rest.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/*
 * Inputs the code under test accepted (each target defines and counts it).
 * The replay main requires at least one, so a seed corpus that no longer
 * reaches the accepting paths fails instead of passing vacuously.
 */
extern unsigned long fuzz_accepted;
