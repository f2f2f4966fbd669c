/*
 * unit_main.c - entry point of the unit-test binary: runs every TEST()
 * linked in (see gmtest.h). Usage: unit [-l] [name-substring...]
 */
#include "gmtest.h"

int main(int argc, char **argv) { return gmtest_main(argc, argv); }
