"""Test workload (issue 12, hole 7): a hostile host's output. Prints terminal control sequences
(OSC title, clear screen, CSI colour, DCS, 8-bit CSI as UTF-8 and as a raw byte) and raw C0/C1
controls, then a plain marker line."""

import sys

sys.stdout.buffer.write(b"ESCAPES \x1b]0;pwned\x07 \x1b[2J \x1b[31mred\x1b[0m \x1bP1$r\x1b\\ \xc2\x9b31m \x9b "
                        b"\xc2\x90dcs \x07\x08\x7f\x0e\x0f \rtail\n")
sys.stdout.buffer.write(b"ESCAPES-END\n")
sys.stdout.flush()
