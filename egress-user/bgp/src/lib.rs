//! BGP speaker and route reflector.
