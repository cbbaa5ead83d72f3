// Empty: libcxlrt.so is the static libraries, whole.
