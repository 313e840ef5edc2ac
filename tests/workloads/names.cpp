// Function names as C++ people write them, for the name-resolution tests: an overloaded
// method in a namespace and a template function with two instances. Each is called a known
// number of times (the test counts entry triggers). Build: g++ -O1 -g names.cpp
#include <cstdio>

namespace shop {
class Cart {
  public:
    __attribute__((noinline)) long add(int n);
    __attribute__((noinline)) long add(double d);
    long total = 0;
};
long Cart::add(int n) { return total += n; }
long Cart::add(double d) { return total += static_cast<long>(d * 2); }
}  // namespace shop

template <typename T> __attribute__((noinline)) T biggest(T a, T b) { return a > b ? a : b; }

int main(int argc, char **) {
    shop::Cart cart;
    long sum = 0;
    for (int i = 0; i < 3; i++) sum += cart.add(i + argc);            // add(int): 3 calls
    for (int i = 0; i < 2; i++) sum += cart.add(0.5 * (i + argc));    // add(double): 2 calls
    for (int i = 0; i < 3; i++) sum += biggest<int>(i, argc);         // biggest<int>: 3
    for (long i = 0; i < 2; i++) sum += biggest<long>(i * 7, argc);   // biggest<long>: 2
    std::printf("result=%ld\n", sum);
    return 0;
}
