// A device-side check without a branch: one predicated PTX trap, so that the check adds no basic block
// to a loop whose registers are all in use (an assert's call to __assertfail and its branch make ptxas
// spill there). A failed check ends the kernel as an assert does and the CUDA context is lost; the error
// the host sees is the trap's ("unspecified launch failure"), without an assert's message.
__device__ __forceinline__ void tk_trap_unless(bool ok) {
  asm volatile("{\n\t.reg .pred bad;\n\tsetp.eq.u32 bad, %0, 0;\n\t@bad trap;\n\t}" :: "r"((unsigned)ok));
}
