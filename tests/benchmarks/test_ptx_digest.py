"""benchmarks/ptx_digest.py's `normalized`: two PTX texts of the same instruction sequence (asm statements split
differently, virtual registers numbered otherwise) normalize alike; another instruction or register use does not."""

from __future__ import annotations

from benchmarks.ptx_digest import normalized

BEFORE = ("\t.reg .f32 \t%f<9>;\n\t// begin inline asm\n\tmax.NaN.f32 %f3, %f3, %f1;\n\t// end inline asm\n"
          "\t// begin inline asm\n\tmin.NaN.f32 %f3, %f3, %f2;\n\t// end inline asm\n\tadd.f32 %f4, %f3, %f1;\n"
          "\tst.global.f32 [%rd2], %f4;\n")
AFTER = ("\t.reg .f32 \t%f<7>;\n\t// begin inline asm\n\tmax.NaN.f32 %f5, %f5, %f2;\n"
         "\tmin.NaN.f32 %f5, %f5, %f6;\n\t// end inline asm\n\tadd.f32 %f1, %f5, %f2;\n"
         "\tst.global.f32 [%rd7], %f1;\n")


def test_the_same_instructions_renumbered_and_regrouped_normalize_alike():
    assert BEFORE != AFTER and normalized(BEFORE) == normalized(AFTER)


def test_another_instruction_or_another_register_use_stays_different():
    assert normalized(BEFORE) != normalized(AFTER.replace("add.f32", "sub.f32"))
    # the add reading the clamp's upper bound instead of its lower: a different data flow
    assert normalized(BEFORE) != normalized(AFTER.replace("add.f32 %f1, %f5, %f2", "add.f32 %f1, %f5, %f6"))
