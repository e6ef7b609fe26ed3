#version 450
// Built-in element-wise multiply: c[i] = a[i] * b[i]. ELEMENT is defined at build time.
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) readonly buffer A { ELEMENT a[]; };
layout(set = 0, binding = 1) readonly buffer B { ELEMENT b[]; };
layout(set = 0, binding = 2) writeonly buffer C { ELEMENT c[]; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  c[i] = a[i] * b[i];
}
